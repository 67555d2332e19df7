"""The ``rlax sft``, ``rlax dpo`` and ``rlax rm`` jobs: a fixed data set in, checkpoints, weight versions and exports out.

The RL job's machinery, not a copy of it: the same ``Trainer`` (mesh, packed rows, token-budget
micro-batches, LoRA) with another objective, the same checkpoints (state + ledger, verified before
trusted), the same weight versions (``job.Publisher``) and Hugging Face / PEFT exports
(``job.export_version``). What differs is where batches come from. One step::

    the step's samples: positions step * n ... of the data's order, each epoch a permutation drawn
    from (sft.shuffle_seed, epoch), so a step's batch is a pure function of the step
    -> supervised_batch / preference_batch -> Trainer.pack -> Trainer.step
    -> metrics: the objective's (loss, ...), tokens/s, the over-length counts; every ``eval_every``
       steps (and after the last) ``heldout_nll``: the validation samples' NLL per trained token
    -> publish version ``step`` / checkpoint / export, as ``rlax train`` does

Exact resume: the newest checkpoint that verifies, whose ledger names the steps it trained
(``GroupKey(step, sample)``); the next step's batch is recomputed from the step alone.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from rlax_core.data.rollout_store import GroupKey
from rlax_core.models.checkpoint import CheckpointError
from rlax_core.models.config import ModelConfig
from rlax_core.models.export import export_hf
from rlax_core.parallel.mesh import initialize_distributed, make_mesh
from rlax_core.training.checkpoint import Checkpointer
from rlax_core.training.config import TrainerConfig
from rlax_core.training.job import HFExport, JobResult, Publisher, export_version, is_exported, restore_or_start
from rlax_core.training.objective import TrainingObjective
from rlax_core.training.packing import real_tokens
from rlax_core.training.step import Trainer
from rlax_core.utils.logging import progress
from rlax_core.utils.metrics import MetricsWriter
from rlax_core.weights import WeightStore

log = logging.getLogger(__name__)


def epoch_order(count: int, seed: int, epoch: int) -> np.ndarray:
    """The data's order in ``epoch``: a permutation that depends on nothing but (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(count)


def step_indices(count: int, per_step: int, step: int, seed: int) -> list[int]:
    """The data items of ``step``: positions ``step * per_step ...`` of the epochs' orders laid end to end."""
    out = []
    for position in range(step * per_step, (step + 1) * per_step):
        epoch, index = divmod(position, count)
        out.append(int(epoch_order(count, seed, epoch)[index]))
    return out


def heldout_nll(trainer: Trainer, state: Any, batches: Sequence[dict[str, np.ndarray]]) -> float:
    """The validation samples' negative log-likelihood per trained token under ``state``'s policy."""
    total, tokens = 0.0, 0.0
    for batch in batches:
        totals = np.asarray(trainer.sequence_logprobs(trainer.pack(batch), state=state))
        total -= float(np.sum(totals))
        tokens += float(np.sum(batch["loss_mask"]))
    return total / max(tokens, 1.0)


def run_post_training(*, model_config: ModelConfig, initial_params: Any, objective: TrainingObjective,
                      config: TrainerConfig, step_batch: Callable[[int, Trainer], dict[str, np.ndarray]],
                      validation: Callable[[Trainer], Sequence[dict[str, np.ndarray]]], eval_every: int, weights: WeightStore | None,
                      checkpoint_dir: str, metrics_dir: str, data_metrics: dict[str, float] | None = None,
                      ref_params: Any = None, stop: threading.Event | None = None,
                      export: HFExport | None = None,
                      evaluate: Callable[[Trainer, Any, Sequence], dict[str, float]] | None = None) -> JobResult:
    """Train ``objective`` on ``step_batch(step, trainer)`` (padded to ``trainer.row_multiple``:
    ``sft_data``) until ``config.total_steps`` or ``stop``; see the module docstring. ``validation(trainer)``:
    the held-out batches, ``evaluate(trainer, state, batches)`` their metrics (default: ``train/heldout_nll``).
    ``ref_params``: DPO's frozen reference (None: with LoRA the base)."""
    evaluate = evaluate or (lambda trainer, state, batches: {"train/heldout_nll": heldout_nll(trainer, state, batches)})
    stop = stop or threading.Event()
    initialize_distributed(config.mesh)
    trainer = Trainer(model_config, objective, config, make_mesh(config.mesh))
    checkpointer = Checkpointer(checkpoint_dir, keep=config.keep_checkpoints, async_save=config.async_checkpointing)
    is_chief = jax.process_index() == 0
    resumed_from, state, ledger = restore_or_start(trainer, checkpointer, initial_params, lora=config.lora.enabled)
    if resumed_from is not None:
        trained = sorted({key.step for key in ledger.consumed})
        if int(state.step) != resumed_from or trained != list(range(resumed_from)):
            raise CheckpointError(f"checkpoint {resumed_from}: its state took {int(state.step)} steps and its ledger "
                                  f"names {len(trained)}")
        log.info("resumed from checkpoint %d", resumed_from)
    if objective.uses_reference and ref_params is not None:
        ref_params = jax.device_put(jax.tree.map(lambda x: np.asarray(x, trainer.param_dtype), ref_params),
                                    trainer.param_shardings)
    step = int(state.step)
    validation = validation(trainer)
    publisher = Publisher(weights, trainer)
    publisher.publish(step, state.params)
    if export is not None and is_chief:
        for folder in export.template_dirs:
            export_hf(folder, model_config, None, tokenizer_source=export.tokenizer_source,
                      generation=export.generation)
    metrics = MetricsWriter(metrics_dir, resumed_from=step) if is_chief else None
    if validation and resumed_from is None:  # every host takes part in the forward; the chief writes
        before = evaluate(trainer, state, validation)
        if metrics is not None:
            metrics.write(0, {**before, **(data_metrics or {})})
    last_saved = resumed_from
    try:
        for _ in progress(range(step, config.total_steps), desc=objective.name, total=config.total_steps - step,
                          unit="step"):
            started = time.monotonic()
            padded = step_batch(step, trainer)
            batch = trainer.pack(padded)
            state, step_metrics = trainer.step(state, batch, ref_params)
            step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            ledger.consumed.extend(GroupKey(step, k) for k in range(int(np.sum(padded["sample_mask"] > 0))))
            step = int(state.step)
            elapsed = time.monotonic() - started
            if step % config.publish_every == 0:
                publisher.publish(step, state.params)
            if step % config.checkpoint_every == 0 or step == config.total_steps:
                checkpointer.save(step, state, ledger)
                last_saved = step
            if export is not None and config.export_every and step % config.export_every == 0:
                export_version(export, step, model_config, state.params, trainer)
            row = {**{f"train/{k}": v for k, v in step_metrics.items()}, "train/step_s": elapsed,
                   "train/tokens_per_s": real_tokens(batch) / elapsed, **(data_metrics or {})}
            if validation and (step % eval_every == 0 or step == config.total_steps):
                row.update(evaluate(trainer, state, validation))
            if metrics is not None:
                metrics.write(step, row)
            if stop.is_set():
                break
        preempted = step < config.total_steps
        if last_saved != step:
            checkpointer.save(step, state, ledger)
        if export is not None and not preempted and not is_exported(export, step):
            export_version(export, step, model_config, state.params, trainer)
    finally:
        checkpointer.close()
        publisher.close()
        if metrics is not None:
            metrics.close()
    return JobResult(step=step, preempted=preempted, resumed_from=resumed_from)
