"""The training loop of the ``rlax train`` job: rollout groups in, weight versions out, preemptible.

One step::

    wait for ``groups_per_step`` rollout groups not yet in the ledger, in schedule order and from
    no step past the first one still being generated; a group whose weight version fails
    ``rlax_core.weights.is_fresh_enough(version, step, max_staleness)`` is dropped (recorded in
    the ledger, counted in the metrics) and the next one is taken
    -> make_batch -> Trainer.step -> ledger.consumed += groups -> metrics (JSONL + TensorBoard)
    -> publish weight version ``step`` (every ``publish_every`` steps, asynchronously)
    -> checkpoint (every ``checkpoint_every`` steps, asynchronously; state + ledger together)
    -> export a Hugging Face folder (every ``export_every`` steps, and after the last step)

On start the loop resumes from the newest checkpoint that passes verification by itself (newer ones
that fail it are skipped with a warning and set aside), or else starts from the
initial parameters and publishes them as version 0 so that the rollout fleet can begin. When
``stop`` is set (SIGTERM: a preemption notice) it finishes the step in flight, checkpoints, waits
for the checkpoint and the publication to land, and returns.

LoRA (``trainer.lora.rank > 0``): the initial parameters are the frozen base; version 0 is that base
in full, and every later version is adapter-only on it (``rlax_core.weights.adapters``). Checkpoints
hold the adapters; a resumed run takes the base from the initial parameters again. Each export is
the merged model plus a PEFT folder (``ROOT/step_XXXXXXXX/adapter``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import jax
import numpy as np

from rlax_core.data.records import oldest_policy_version
from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.models.config import ModelConfig
from rlax_core.models.export import MODEL_CONFIG, export_hf
from rlax_core.models.lora_export import export_peft
from rlax_core.parallel.mesh import initialize_distributed, make_mesh
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.batching import make_batch
from rlax_core.training.packing import real_tokens
from rlax_core.training.checkpoint import Checkpointer
from rlax_core.training.compile_ahead import CompileAhead
from rlax_core.training.config import TrainerConfig
from rlax_core.training.ledger import DataLedger
from rlax_core.training.step import Trainer
from rlax_core.utils.logging import progress
from rlax_core.utils import startup
from rlax_core.utils.metrics import MetricsWriter
from rlax_core.utils.wandb_logger import WandbLogger
from rlax_core.weights import AsyncPublisher, WeightStore, is_fresh_enough
from rlax_core.weights.adapters import adapter_reference, is_adapter_version
from rlax_core.weights.repair import heal_if_refused

log = logging.getLogger(__name__)
WAIT_REPORT_S = 30.0  # how often a trainer waiting for rollout groups says so
COMPILE_AHEAD_TIMEOUT_S = 3600.0  # a step waiting on its shape's compile ahead (a large model on a slice: minutes)


@dataclass(frozen=True)
class HFExport:
    """Where and how the job writes Hugging Face folders (``rlax_core.models.export``)."""

    root: str  # versions go to ROOT/step_XXXXXXXX/
    tokenizer_source: str  # the initial model's tokenizer folder or file
    generation: Mapping[str, Any] = field(default_factory=dict)  # sampling settings for generation_config.json
    template_dirs: tuple[str, ...] = ()  # model templates (no weights) for the weight store and checkpoints

    def folder(self, step: int) -> str:
        return f"{self.root.rstrip('/')}/step_{step:08d}"


@dataclass
class JobResult:
    step: int  # optimizer steps taken, in this run and before it
    preempted: bool  # stopped by a stop request before total_steps
    resumed_from: int | None  # the checkpoint this run started from


class BatchReader:
    """Takes the next rollout groups from the store in schedule order, enforcing the staleness bound."""

    def __init__(self, store: RolloutStore, config: TrainerConfig, startup_wait_s: float = 0.0):
        self.store = store
        self.config = config
        self.startup_wait_s = startup_wait_s  # added to the first wait: the rollout fleet starts up first
        self._generated_below = 0  # every schedule step below this one is fully generated
        self._first_read = True

    def generation_frontier(self, keys: list[GroupKey]) -> int:
        """The first schedule step not fully generated yet; no group past it is taken.

        The schedule lets step s be generated with weights no older than s - max_staleness, so in
        order train step t takes schedule step t's groups (or later ones, where dynamic sampling
        dropped some), fresh by construction. Taking a later step's groups while step t's are still
        being generated would leave step t's groups for a later train step, too stale to use: they
        would be dropped and never generated again, and the run could not finish.
        """
        step = self._generated_below
        while self.store.is_step_complete(step, self.config.groups_per_step, keys):
            step += 1
        self._generated_below = step
        return step

    def next_groups(self, ledger: DataLedger, train_step: int, stop: threading.Event,
                    while_waiting: Callable[[], None] | None = None):
        """``groups_per_step`` (key, table) pairs; None if ``stop`` was set first. Drops go into ``ledger``.
        ``while_waiting`` runs once per poll while the groups are not all there."""
        config = self.config
        chosen: list[tuple[GroupKey, Any]] = []
        started = time.monotonic()
        budget_s = config.wait_timeout_s + (self.startup_wait_s if self._first_read else 0.0)
        deadline, report_at = started + budget_s, started + WAIT_REPORT_S
        while True:
            taken = {key for key, _ in chosen}
            keys = self.store.list_groups()
            frontier = self.generation_frontier(keys)
            for key in ledger.pending(keys):
                if key.step > frontier:
                    break
                if key in taken:
                    continue
                table = self.store.read_group(key)
                version = oldest_policy_version(table)
                if not is_fresh_enough(version, train_step, config.max_staleness):
                    log.info("dropping stale group %s: weight version %d at train step %d (max staleness %d)",
                             key, version, train_step, config.max_staleness)
                    ledger.dropped.append(key)
                    continue
                chosen.append((key, table))
                if len(chosen) == config.groups_per_step:
                    self._first_read = False
                    return chosen
            if stop.is_set():
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"train step {train_step}: {len(chosen)} of {config.groups_per_step} rollout groups "
                                   f"after waiting {budget_s:.0f} s in {self.store}; is the rollout "
                                   "pipeline running?")
            if time.monotonic() > report_at:  # a trainer started alone must not wait in silence
                report_at += WAIT_REPORT_S
                log.info("train step %d: waiting for rollout groups in %s (%d of %d so far, %.0f of %.0f s); "
                         "`rlax rollout` writes them (`rlax launch` starts both jobs)", train_step, self.store,
                         len(chosen), config.groups_per_step, time.monotonic() - started, budget_s)
            if while_waiting is not None:
                while_waiting()
            time.sleep(config.poll_s)


def run_training(*, model_config: ModelConfig, initial_params: Any, algorithm: AlgorithmConfig,
                 config: TrainerConfig, store: RolloutStore, weights: WeightStore | None, checkpoint_dir: str,
                 metrics_dir: str, stop: threading.Event | None = None, export: HFExport | None = None,
                 rollouts_per_step: int | None = None, startup_wait_s: float = 0.0) -> JobResult:
    """Train until ``config.total_steps`` (or ``stop``); see the module docstring. ``rollouts_per_step``
    (groups x samples per group), when known, lets the update compile before the first rollouts arrive;
    ``startup_wait_s`` is added to the wait for the first groups (the rollout fleet's start-up)."""
    stop = stop or threading.Event()
    initialize_distributed(config.mesh)
    mesh = make_mesh(config.mesh)
    trainer = Trainer(model_config, algorithm, config, mesh)
    checkpointer = Checkpointer(checkpoint_dir, keep=config.keep_checkpoints, async_save=config.async_checkpointing)
    is_chief = jax.process_index() == 0

    # The newest checkpoint that passes verification; newer ones that fail it are set aside, and the
    # run trains their steps again from the ledger saved with the one chosen (the rollout groups it
    # has not consumed are still in the store): the same batches, so the same parameters.
    resumed_from, state, ledger = restore_or_start(trainer, checkpointer, initial_params, lora=config.lora.enabled)
    if resumed_from is not None:
        _check_resumed(resumed_from, state, ledger, config)
        log.info("resumed from checkpoint %d (%d groups consumed, %d dropped)", resumed_from,
                 len(ledger.consumed), len(ledger.dropped))
    ref_params = None
    if algorithm.uses_reference and not config.lora.enabled:  # LoRA: the reference is the trainer's base
        ref_params = jax.device_put(jax.tree.map(lambda x: np.asarray(x, trainer.param_dtype), initial_params),
                                    trainer.param_shardings)
    step = int(state.step)
    publisher = Publisher(weights, trainer)
    startup.mark("trainer_publish")
    publisher.publish(step, state.params)
    published = step  # the newest version handed to the publisher: its commit time goes in the next row

    if export is not None and is_chief:
        for folder in export.template_dirs:
            export_hf(folder, model_config, None, tokenizer_source=export.tokenizer_source,
                      generation=export.generation)
    # While the rollout workers start: the first step then runs at once when its groups land. Packed
    # rows take their shape from each batch (a bucket of its tokens): the likely buckets compile behind.
    ahead = None
    if rollouts_per_step and step < config.total_steps and not config.row_tokens:
        trainer.compile_step(state, rollouts_per_step, ref_params)
        startup.mark("trainer_compiled")
    elif rollouts_per_step and step < config.total_steps and config.compile_ahead_tokens:
        ahead = CompileAhead(trainer, state, rollouts_per_step, ref_params, config.compile_ahead_means)
    metrics = MetricsWriter(metrics_dir, resumed_from=step) if is_chief else None
    wandb = WandbLogger(config.wandb, metrics_dir=metrics_dir) if is_chief and config.wandb.enabled else None
    reader = BatchReader(store, config, startup_wait_s)
    last_saved = resumed_from
    warned_padding = False
    try:
        for _ in progress(range(step, config.total_steps), desc="train", total=config.total_steps - step, unit="step"):
            waited, wait_start_t = time.monotonic(), time.time()
            dropped_before = len(ledger.dropped)
            # A version readers refused (damaged after its commit) is repaired from the params in hand:
            # with k = 0 no rollout of this step can be made before it loads.
            groups = reader.next_groups(ledger, step, stop,
                                        while_waiting=lambda: publisher.while_waiting(step, state.params))
            if groups is None:
                break
            started, read_t = time.monotonic(), time.time()
            startup.mark("trainer_first_read", read_t)
            padded = make_batch([table for _, table in groups], max_seq_len=config.max_seq_len,
                                row_multiple=trainer.row_multiple, pad_id=model_config.pad_token_id or 0,
                                routed=trainer.replay.records)
            if not warned_padding:
                warned_padding = _warn_if_mostly_padding(padded, trainer)
            batch = trainer.pack(padded)
            if ahead is not None:
                ahead.wait_for(batch, timeout_s=COMPILE_AHEAD_TIMEOUT_S)
            state, step_metrics = trainer.step(state, batch, ref_params)
            step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            startup.mark("trainer_compiled")  # the first step compiled what no warm-up did
            step = int(state.step)
            ledger.consumed.extend(key for key, _ in groups)
            elapsed = time.monotonic() - started
            publish_t = None
            if step % config.publish_every == 0:
                publish_t = time.time()
                publisher.publish(step, state.params)
            if step % config.checkpoint_every == 0 or step == config.total_steps:
                checkpointer.save(step, state, ledger)
                last_saved = step
            if export is not None and config.export_every and step % config.export_every == 0:
                export_version(export, step, model_config, state.params, trainer)
            if metrics is not None:
                tokens = float(real_tokens(batch))
                versions = batch["policy_versions"][batch["sample_mask"] > 0]
                row = {
                    **{f"train/{k}": v for k, v in step_metrics.items()},
                    "train/step_s": elapsed, "train/wait_s": started - waited, "train/tokens_per_s": tokens / elapsed,
                    "train/staleness_mean": float(np.mean(step - 1 - versions)),
                    "train/dropped_stale": len(ledger.dropped) - dropped_before,
                    "train/dropped_stale_total": len(ledger.dropped),
                    "train/groups_consumed_total": len(ledger.consumed),
                    **_timeline(wait_start_t, read_t, publish_t, published, publisher.commit_time(published)),
                }
                metrics.write(step, {**row, **startup.take()})  # the process's start-up, in its first row
                if wandb is not None:
                    wandb.write(step, row)
            if publish_t is not None:
                published = step
            if stop.is_set():
                break
        preempted = step < config.total_steps
        if last_saved != step:
            checkpointer.save(step, state, ledger)
        if export is not None and not preempted and not is_exported(export, step):
            export_version(export, step, model_config, state.params, trainer)
        if preempted:
            log.info("stop requested: checkpointed step %d and leaving", step)
    finally:
        checkpointer.close()  # waits for background saves
        publisher.close()
        if metrics is not None:
            metrics.close()
        if wandb is not None:
            wandb.close()
    return JobResult(step=step, preempted=preempted, resumed_from=resumed_from)


def restore_or_start(trainer: Trainer, checkpointer: Checkpointer, initial_params: Any, *,
                     lora: bool) -> tuple[int | None, Any, DataLedger]:
    """``(step, state, ledger)`` of the newest checkpoint that passes verification, or ``(None, a fresh
    state, an empty ledger)``. A LoRA run's checkpoints hold its adapters, so its base comes first."""
    if lora and checkpointer.all_steps():
        trainer.load_base(initial_params)
    resumed = checkpointer.restore_newest(trainer.abstract_state())
    if resumed is None:
        return None, trainer.init_state(initial_params), DataLedger()
    return resumed


def _check_resumed(step: int, state: Any, ledger: DataLedger, config: TrainerConfig) -> None:
    """The state and ledger restored from checkpoint ``step`` tell the same story: the state took
    ``step`` steps and the ledger holds the groups of exactly those steps (each step trains
    ``groups_per_step`` groups), so replay from here takes the batches the lost steps took."""
    from rlax_core.models.checkpoint import CheckpointError

    if int(state.step) != step:
        raise CheckpointError(f"checkpoint {step} holds the state of step {int(state.step)}")
    if len(ledger.consumed) != step * config.groups_per_step:
        raise CheckpointError(f"checkpoint {step}: its data ledger holds {len(ledger.consumed)} consumed groups, "
                              f"{step} steps of trainer.groups_per_step={config.groups_per_step} take "
                              f"{step * config.groups_per_step}; was trainer.groups_per_step changed for this run?")


def _warn_if_mostly_padding(batch: Mapping[str, np.ndarray], trainer: Trainer) -> bool:
    """Log once when the batch is padded to over twice its rows (every padded row costs a real one's
    compute): more device shards x mini-batches x micro-batches than the step has rows. True if it did."""
    rows, padded = int(np.sum(batch["sample_mask"] > 0)), len(batch["sample_mask"])
    if padded < 2 * rows:
        return False
    log.warning("train: a step's %d rows are padded to %d (%d device shards x %d mini-batches x %d micro-batches "
                "= rows in multiples of %d); lower trainer.micro_batches or raise trainer.groups_per_step",
                rows, padded, trainer.batch_shards, trainer.config.mini_batches, trainer.config.micro_batches,
                trainer.row_multiple)
    return True


def _timeline(wait_start_t: float, read_t: float, publish_t: float | None, previous_version: int,
              previous_commit_t: float | None) -> dict:
    """This step's wall clocks for the loop's step timeline (``rlax_core.utils.timeline``): when it
    waited and read, when it handed its version over, and when the version published before it was
    committed (a whole step ago, so its commit is known unless a newer one superseded it)."""
    row = {"timeline/wait_start_t": wait_start_t, "timeline/read_t": read_t}
    if publish_t is not None:
        row["timeline/publish_t"] = publish_t
    if previous_commit_t is not None:
        row["timeline/commit_version"], row["timeline/commit_t"] = previous_version, previous_commit_t
    return row


def export_version(export: HFExport, step: int, model_config: ModelConfig, params: Any, trainer: Trainer) -> None:
    """Every host takes part in gathering the params; the chief writes the folder (LoRA: the merged
    model, and the adapters as a PEFT folder inside it)."""
    adapters = None
    if trainer.lora.enabled:
        adapters, params = params, trainer.policy_params(params)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        params, adapters = multihost_utils.process_allgather((params, adapters), tiled=True)
    else:
        params, adapters = jax.device_get((params, adapters))
    if jax.process_index() != 0:
        return
    started = time.monotonic()
    if adapters is not None:  # first: the folder is complete once export_hf writes config.json
        export_peft(f"{export.folder(step)}/adapter", model_config, trainer.lora, adapters,
                    base_model=export.tokenizer_source)
    export_hf(export.folder(step), model_config, params, tokenizer_source=export.tokenizer_source,
              generation=export.generation)
    log.info("exported step %d as a Hugging Face folder: %s (%.1f s)", step, export.folder(step),
             time.monotonic() - started)


def is_exported(export: HFExport, step: int) -> bool:
    """True when step's folder is complete (``config.json`` is written last): a re-run does not redo it."""
    from rlax_core.utils.storage import open_storage

    return open_storage(export.folder(step)).exists(MODEL_CONFIG)


class Publisher:
    """Weight versions out: asynchronous on one host, collective (every host writes its shards) on many."""

    def __init__(self, store: WeightStore | None, trainer: Trainer):
        self.store = store
        self.trainer = trainer
        self.adapter: dict[str, Any] | None = None  # LoRA: the manifest entry naming the base version
        self.multi_host = jax.process_count() > 1
        self.async_publisher = AsyncPublisher(store) if store is not None and not self.multi_host else None
        self._sync_commits: dict[int, float] = {}

    def commit_time(self, version: int | None) -> float | None:
        """Wall clock of ``version``'s commit by this run (None: not committed yet, superseded, or long ago)."""
        commits = self.async_publisher.commit_times if self.async_publisher is not None else self._sync_commits
        return commits.get(version)

    def publish(self, version: int, params: Any) -> None:
        if self.store is None or self.store.is_committed(version):
            # Already there: published by this run before a restart; the resumed run recomputes
            # bit-identical parameters, and committed versions are immutable.
            return
        adapter = None
        if self.trainer.lora.enabled:
            adapter = self._lora_base(version, params)
            if adapter is None:
                return  # this version was the base itself
        if self.async_publisher is not None:
            self.async_publisher.submit(version, params, adapter=adapter)
        else:
            self.store.publish(version, params, adapter=adapter)
            self._sync_commits = {v: t for v, t in self._sync_commits.items() if v >= version - 1}
            self._sync_commits[version] = time.time()
        if jax.process_index() == 0:
            self.store.gc()

    def _lora_base(self, version: int, adapters: Any) -> dict[str, Any] | None:
        """The adapter entry for ``version``; first the base: version 0 when this run published it (in
        full), else the policy of ``version`` published in full, which then is the base (None returned)."""
        if self.adapter is None:
            if version > 0 and self.store.is_committed(0) and not is_adapter_version(self.store, 0):
                self.adapter = adapter_reference(self.store, 0, self.trainer.lora)
            else:
                self.store.publish(version, self.trainer.policy_params(adapters))  # synchronous: pinned next
                if jax.process_index() != 0:  # host 0 commits once every host's part is written
                    next(self.store.watch(after=version - 1))
                self.adapter = adapter_reference(self.store, version, self.trainer.lora)
                return None
        return self.adapter

    def while_waiting(self, version: int, params: Any) -> None:
        """Between polls for rollouts: raise a failed background publication (its version never
        commits, so the rollouts waited for never come), and repair ``version`` if readers reported it
        refused (single host: the whole params are in hand)."""
        if self.async_publisher is not None:
            self.async_publisher.raise_if_failed()
        if self.store is not None and not self.multi_host:
            heal_if_refused(self.store, version, params)

    def close(self) -> None:
        if self.async_publisher is not None:
            self.async_publisher.close()
