"""The rollout fleet as Beam transforms: schedule -> generate -> score -> assemble -> write.

    ticks --ScheduleSteps--> WorkUnit --Reshuffle--> GenerateRollouts --> RolloutGroup --ScoreRollouts-->
          --AssembleGroups (dynamic sampling)--> WriteGroups --> rollout store

Work is spread in units of ``groups_per_unit`` prompt groups, not whole steps: pacing lets only
steps ``v .. v + k`` be generated, so with one element per step at most ``k + 1`` workers of a fleet
would ever be busy; cut into units and reshuffled, every step is shared by every worker.

Each DoFn wraps one piece of ``rlax_core`` or of ``transforms.rollout_schedule``; none holds model
math. The newest committed weight version reaches ``ScheduleSteps`` and ``GenerateRollouts`` as a
slowly updating side input (``transforms.live_side_input``), the same value in both for a window.

``GenerateRollouts`` keeps one engine per worker process (``apache_beam.utils.shared.Shared``): the
model compiles once and every DoFn instance of the process reuses it; when the side input names a
newer version, the weights are loaded from the parameter server and swapped in without
recompiling. Every rollout carries the version that generated it. The harness threads of a process
share its engine: units that arrive while the engine is busy are generated together in its next
call (``_Worker.generate``), so an accelerator VM whose one SDK process owns the chips keeps them full.

Exactly-once at the store: groups are written under names from ``(run, step, prompt slot)`` only,
so a retried bundle or a restarted pipeline rewrites the same file (the same tokens, when the same
version regenerates it) and the trainer never sees a duplicate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from typing import Iterable, Optional

import apache_beam as beam
import fsspec
from apache_beam.utils.shared import Shared
from apache_beam.utils.windowed_value import WindowedValue

from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.data.training_set import cached_examples
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.rewards.config import RewardConfig
from rlax_core.weights.config import WeightStoreConfig
from transforms.worker_heartbeat import Busy
from transforms.rollout_schedule import prompt_indices, rollout_prompt_id, sample_seed, steps_to_generate, work_units
from transforms.rollout_worker import _Worker

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Everything a rollout worker needs; picklable, so Beam ships it to every worker."""

    run: str
    run_seed: int
    model_path: str  # base checkpoint: architecture and tokenizer (weights come from the store)
    # Where the Example rows are (parquet file or folder, or .jsonl; local or gs://): workers read
    # them once per process (``cached_examples``), so the job graph does not grow with the data.
    train_set: str
    train_set_size: int  # rows the launcher saw there; a worker that reads another count stops
    rollout_root: str
    weights: WeightStoreConfig
    engine: EngineConfig
    sampling: SamplingParams  # n = samples per prompt (G)
    prompts_per_step: int
    total_steps: int
    max_staleness: int = 0
    # A factory, not a default instance: a fresh worker process unpickles this module before any task
    # has registered its reward terms, and RewardConfig checks its terms against that registry.
    rewards: RewardConfig = dataclasses.field(default_factory=lambda: RewardConfig(terms={"story_word": 1.0}))
    drop_uniform_groups: bool = False  # DAPO dynamic sampling: write only groups with reward variance
    groups_per_unit: int = 1  # prompt groups per work unit: the grain at which the fleet shares a step
    # The engine's parameter dtype (model.dtype): the base checkpoint loads in it and every published
    # version is cast to it, whatever dtype the trainer publishes (weights.publish_dtype).
    model_dtype: str = "float32"
    # JAX's persistent compilation cache on the worker (rlax_core.utils.compile_cache): on or off, and
    # its folder ("" = the worker machine's default).
    compilation_cache: bool = True
    compilation_cache_dir: str = ""

    def __post_init__(self):
        if self.groups_per_unit < 1:
            raise ValueError(f"groups_per_unit must be >= 1, got {self.groups_per_unit}")

    def store(self) -> RolloutStore:
        return RolloutStore(self.rollout_root, self.run)

    def examples(self) -> tuple[dict, ...]:
        """The training set's rows, read once per worker process."""
        rows = cached_examples(self.train_set)
        if len(rows) != self.train_set_size:
            raise RuntimeError(f"training set {self.train_set} holds {len(rows)} rows, the job was launched with "
                               f"{self.train_set_size}: the prompt schedule would change; relaunch the job")
        return rows


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """Some prompt slots of one schedule step to generate, and the newest version known when scheduled."""

    step: int
    version: int
    slots: tuple[int, ...]
    # The step's timeline (wall clocks, time.time()): when this process first saw ``version`` in the
    # side input and when the unit was scheduled (rlax_core.utils.timeline joins them).
    version_seen_t: float = dataclasses.field(default=0.0, compare=False)
    scheduled_t: float = dataclasses.field(default=0.0, compare=False)


# ----------------------------------------------------------------------------- schedule

# The side input as the stream hands it over (``AsList``): every version in the element's window, as
# a streaming runner may fire a window's pane more than once; empty before the first publish.
SideVersions = list[int]


# Steps handed to generation in this process and not yet written, with when: the schedule re-emits
# a step only when its claim is older than ``claim_timeout_s`` (a lost bundle), so a step is not
# generated twice while in flight. Correctness does not rest on it: writes are idempotent.
_claims: dict[tuple[str, int], float] = {}
_claims_lock = threading.Lock()
# (run, version) -> when ScheduleSteps in this process first saw the version in the side input.
_versions_seen: dict[tuple[str, int], float] = {}


def release_claim(run: str, step: int) -> None:
    with _claims_lock:
        _claims.pop((run, step), None)


class ScheduleSteps(beam.DoFn):
    """On each tick, the work units of the steps the latest committed version allows (``steps_to_generate``).

    A step is scheduled whole (all its units in the same tick, so its groups meet again in one window
    at ``MarkStepGenerated``); a step partly in the store is scheduled whole again, its written groups
    rewritten under the same names.
    """

    def __init__(self, spec: RolloutSpec, claim_timeout_s: float = 300.0):
        self._spec = spec
        self._claim_timeout_s = claim_timeout_s

    def setup(self):
        self._store = self._spec.store()
        # Steps found complete in the store stay complete (groups are never removed): the store is
        # listed only on a tick that has a step neither known complete nor in flight, about once
        # per new version, rather than on every tick.
        self._complete: set[int] = set()

    def process(self, tick_version: Optional[int], side_versions: SideVersions) -> Iterable[WorkUnit]:
        # A tick carries the version that made it; the side input of its window holds the same once
        # the runner has materialized it (Prism sometimes hands it over before that, empty).
        known = [*side_versions, *([] if tick_version is None else [tick_version])]
        if not known:  # the trainer has not published its first weights yet
            return
        latest_version = max(known)
        seen_t = _versions_seen.setdefault((self._spec.run, latest_version), time.time())
        allowed = steps_to_generate(latest_version, self._spec.max_staleness, self._spec.total_steps,
                                    self._complete)
        now = time.monotonic()
        with _claims_lock:
            unclaimed = [s for s in allowed if not self._in_flight(s, now)]
        if not unclaimed:
            return
        self._complete |= complete_steps(self._store, self._spec, unclaimed)
        for step in (s for s in unclaimed if s not in self._complete):
            key = (self._spec.run, step)
            with _claims_lock:
                if self._in_flight(step, now):
                    continue
                _claims[key] = now
            scheduled_t = time.time()
            for slots in work_units(self._spec.prompts_per_step, self._spec.groups_per_unit):
                yield WorkUnit(step=step, version=latest_version, slots=slots, version_seen_t=seen_t,
                               scheduled_t=scheduled_t)

    def _in_flight(self, step: int, now: float) -> bool:
        """Whether ``step`` was handed to generation less than ``claim_timeout_s`` ago (hold ``_claims_lock``)."""
        claimed = _claims.get((self._spec.run, step))
        return claimed is not None and now - claimed < self._claim_timeout_s


def complete_steps(store: RolloutStore, spec: RolloutSpec, candidates: Iterable[int]) -> set[int]:
    """Which of ``candidates`` are fully generated (a restarted pipeline skips them): every group is in
    the store, or (dynamic sampling may drop groups, even all of them) the step's marker is."""
    keys = store.list_groups()
    return {step for step in candidates if store.is_step_complete(step, spec.prompts_per_step, keys)}


# ----------------------------------------------------------------------------- generation


def acquire_worker(shared: Shared, spec: RolloutSpec) -> _Worker:
    """This process's rollout worker (engine, tokenizer, weights), built on first use: every DoFn
    instance holding ``shared`` (or an unpickled copy of it) in this process gets the same one."""
    return shared.acquire(lambda: _Worker(spec), tag=f"rollout-worker-{spec.run}")


class GenerateRollouts(beam.DoFn):
    """Work units -> one RolloutGroup per prompt slot (G samples each), stamped with its version.

    The units of a bundle are generated together, an engine call as soon as they would fill the
    engine's slots (and the rest when the bundle ends): small units spread a step over the fleet
    without leaving a worker's engine to decode a handful of sequences at a time. A unit whose step
    the newest usable weights are too old for is deferred: its step's claim is released, so the
    schedule offers the step again once the version is repaired or superseded.
    """

    def __init__(self, spec: RolloutSpec, shared: Shared):
        self._spec = spec
        self._shared = shared

    def setup(self):
        spec = self._spec
        with Busy(spec.rollout_root, spec.run, "starting: loading and compiling the engine"):
            self._worker = acquire_worker(self._shared, spec)
        self._examples = spec.examples()
        self._capacity = spec.engine.num_slots * len(self._worker.engine.engines)  # sequences per engine call
        self._versions_refused = beam.metrics.Metrics.counter("rollout", "weight_versions_refused")
        self._steps_deferred = beam.metrics.Metrics.counter("rollout", "steps_deferred_no_fresh_weights")
        self._generated = beam.metrics.Metrics.counter("rollout", "groups_generated")

    def start_bundle(self):
        self._pending: list[tuple[WorkUnit, int, WindowedValue]] = []

    def process(self, unit: WorkUnit, side_versions: SideVersions, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        version = max([unit.version, *side_versions])
        self._pending.append((unit, version, WindowedValue(None, timestamp, [window])))
        if sum(len(u.slots) for u, _, _ in self._pending) * self._spec.sampling.n >= self._capacity:
            yield from self._generate_pending()

    def finish_bundle(self):
        yield from self._generate_pending()

    def _generate_pending(self) -> Iterable[WindowedValue]:
        from rlax_core.inference.engine import Request

        spec, worker = self._spec, self._worker
        pending, self._pending = self._pending, []
        if not pending:
            return
        units = []  # per unit: [(slot, training-set row)], its requests
        for unit, _, _ in pending:
            step_rows = prompt_indices(spec.run_seed, unit.step, len(self._examples), spec.prompts_per_step)
            slots = [(slot, step_rows[slot]) for slot in unit.slots]
            requests = [Request(worker.prompt_ids(self._examples[row]), spec.sampling,
                                prompt_id=rollout_prompt_id(spec.run, unit.step, slot),
                                seed=sample_seed(spec.run_seed, unit.step)) for slot, row in slots]
            units.append((slots, requests))
        with Busy(spec.rollout_root, spec.run, f"generating steps {sorted({u.step for u, _, _ in pending})}"):
            batch = worker.generate([(requests, unit.step - spec.max_staleness)
                                     for (unit, _, _), (_, requests) in zip(pending, units)],
                                    max(version for _, version, _ in pending))
        if batch.refused:
            self._versions_refused.inc(batch.refused)
            logger.error("rollout worker: %d weight version(s) refused (%s); generating with version %s",
                         batch.refused, ", ".join(f"{v}: {why}" for v, why in sorted(worker.follower.refused.items())),
                         batch.loaded)
        store = spec.store()
        groups = sum(len(slots) for (slots, _), result in zip(units, batch.results) if result is not None)
        deferred: set[int] = set()
        for (unit, _, place), (slots, requests), completions in zip(pending, units, batch.results):
            if completions is None:
                # Too stale for the trainer to use: wait for the version to be repaired or superseded.
                if unit.step not in deferred:
                    deferred.add(unit.step)
                    self._steps_deferred.inc()
                    logger.warning("rollout worker: step %d needs weights >= %d, the newest usable is %s; deferring it",
                                   unit.step, unit.step - spec.max_staleness, batch.loaded)
                    release_claim(spec.run, unit.step)
                continue
            by_prompt: dict[str, list] = {}
            for completion in completions:
                by_prompt.setdefault(completion.prompt_id, []).append(completion)
            for (slot, row), request in zip(slots, requests):
                key = GroupKey(unit.step, slot)
                example = self._examples[row]
                samples = sorted(by_prompt[request.prompt_id], key=lambda c: c.sample_index)
                group_rows = [{
                    "example_id": example["id"],
                    "group_id": store.group_id(key),
                    "sample_idx": c.sample_index,
                    "policy_version": c.weight_version,
                    "seed": c.seed,
                    "prompt_ids": list(c.prompt_ids),
                    "completion_ids": list(c.completion_ids),
                    "behavior_logprobs": list(c.logprobs),
                    "finish_reason": c.finish_reason,
                    "reward": None,
                    "reward_info": None,
                } for c in samples]
                self._generated.inc()
                yield place.with_value({
                    "key": (key.step, key.prompt_index), "example": example, "rows": group_rows,
                    "texts": [worker.tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in samples],
                    "generate_seconds": batch.seconds / groups, "worker": worker.name,
                    "timeline": {"scheduled_version": unit.version, "version_seen_t": unit.version_seen_t,
                                 "scheduled_t": unit.scheduled_t, **batch.timeline}})


# ----------------------------------------------------------------------------- reward, assembly, write


class ScoreRollouts(beam.DoFn):
    """Scores every sample of a group with the configured reward terms (``rlax_core.rewards``).

    A sample that cannot be scored is reward 0 with its reason in ``reward_info`` (the ``Rewarder``
    isolates it), counted in ``rewards/samples_failed``; a scorer that cannot work at all raises.
    """

    def __init__(self, spec: RolloutSpec):
        self._spec = spec
        self._failed = beam.metrics.Metrics.counter("rewards", "samples_failed")

    def setup(self):
        from rlax_core.rewards.scorer import Rewarder

        # Imports the built-in task terms and the config's own reward modules and functions in this
        # worker before building the terms (rlax_core.rewards.custom).
        self._rewarder = Rewarder(self._spec.rewards)

    def teardown(self):
        self._rewarder.close()

    def process(self, group: dict):
        from rlax_core.rewards.registry import Sample

        samples = [Sample(group["example"], text, row["finish_reason"], len(row["completion_ids"]))
                   for row, text in zip(group["rows"], group["texts"])]
        from rlax_core.rewards.scorer import failed_samples

        results = self._rewarder.score_many(samples)
        self._failed.inc(failed_samples(results))
        rows = [{**row, "reward": float(reward), "reward_info": json.dumps(info, sort_keys=True)}
                for row, (reward, info) in zip(group["rows"], results)]
        yield {**group, "rows": rows, "timeline": {**group.get("timeline", {}), "scored_t": time.time()}}


class AssembleGroups(beam.DoFn):
    """DAPO dynamic sampling at the group level: with ``drop_uniform_groups``, a group whose rewards
    are all equal (no learning signal) goes to the ``dropped`` output instead of the store."""

    DROPPED = "dropped"

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def process(self, group: dict):
        from rlax_core.rl.dynamic_sampling import group_rewards, has_reward_variance

        if self._spec.drop_uniform_groups and not has_reward_variance(group_rewards(group["rows"])):
            yield beam.pvalue.TaggedOutput(self.DROPPED, group)
        else:
            yield group


class WriteGroups(beam.DoFn):
    """Writes each group under its idempotent name; yields the group's summary for its step."""

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def setup(self):
        self._store = self._spec.store()

    def process(self, group: dict):
        step, slot = group["key"]
        self._store.write_group(GroupKey(step, slot), group["rows"])
        yield step, group_summary({**group, "timeline": {**group.get("timeline", {}), "written_t": time.time()}},
                                  written=True)


def group_summary(group: dict, *, written: bool) -> dict:
    """What the step's metrics need of one group (small: it travels through a GroupByKey)."""
    rows = group["rows"]
    return {
        "slot": group["key"][1],
        "written": written,
        "rewards": [row["reward"] for row in rows],
        "passes": [bool(json.loads(row["reward_info"]).get("pass", False)) for row in rows],
        "lengths": [len(row["completion_ids"]) for row in rows],
        "versions": [row["policy_version"] for row in rows],
        "generate_seconds": group["generate_seconds"],
        "worker": group["worker"],
        "timeline": group.get("timeline", {}),  # a group made outside GenerateRollouts may carry none
    }


def step_metrics(step: int, summaries: list[dict]) -> dict:
    """Rollout-side metrics of one schedule step from its groups' summaries."""
    rewards = [r for s in summaries for r in s["rewards"]]
    passes = [p for s in summaries for p in s["passes"]]
    lengths = [n for s in summaries for n in s["lengths"]]
    seconds = sum(s["generate_seconds"] for s in summaries)
    return {
        "step": step,
        "policy_version": min(v for s in summaries for v in s["versions"]),
        "groups": len(summaries),
        "groups_dropped_uniform": sum(not s["written"] for s in summaries),
        "workers": len({s["worker"] for s in summaries}),  # SDK processes that generated the step
        # Engine calls that generated it (one clock per call): more than one per worker splits its batch.
        "engine_calls": len({(s["worker"], s["timeline"].get("generate_call_t")) for s in summaries}),
        "reward_mean": sum(rewards) / len(rewards),
        "pass_rate": sum(passes) / len(passes),
        "response_length_mean": sum(lengths) / len(lengths),
        "rollout_seconds": seconds,
        "rollout_tokens_per_s": sum(lengths) / seconds if seconds > 0 else None,
        **step_timeline_clocks([s["timeline"] for s in summaries]),
    }


# How a step's groups' clocks combine into the step's: it starts with its first group and ends with its last.
_FIRST = ("version_seen_t", "scheduled_t", "generate_call_t")
_LAST = ("swap_s", "generated_t", "scored_t", "written_t")


def step_timeline_clocks(clocks: list[dict]) -> dict:
    """The step's ``timeline/...`` metrics from its groups' clocks (format: rlax_core.utils.timeline);
    clocks a group lacks are left out."""
    row = {}
    scheduled = [c["scheduled_version"] for c in clocks if c.get("scheduled_version") is not None]
    if scheduled:
        row["timeline/scheduled_version"] = min(scheduled)
    swapped = [c["swap_version"] for c in clocks if c.get("swap_version") is not None]
    if swapped:
        row["timeline/swap_version"] = max(swapped)
    for name in _FIRST + _LAST:
        values = [c[name] for c in clocks if c.get(name) is not None]
        if values:
            row[f"timeline/{name}"] = (min if name in _FIRST else max)(values)
    return row


class MarkStepGenerated(beam.DoFn):
    """Per step (its groups' summaries, written or dropped): write ``ROOT/RUN-metrics/step_N.json`` and
    the step's ``_GENERATED`` marker once every prompt slot is accounted for. Both are idempotent."""

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def setup(self):
        self._store = self._spec.store()

    def process(self, keyed):
        step, summaries = keyed
        by_slot = {s["slot"]: s for s in summaries}  # a retried bundle may deliver a slot twice
        if len(by_slot) < self._spec.prompts_per_step:
            return
        metrics = {**step_metrics(step, list(by_slot.values())), "timeline/marked_t": time.time()}
        fs, folder = fsspec.core.url_to_fs(f"{self._spec.rollout_root}/{self._spec.run}-metrics")
        fs.makedirs(folder, exist_ok=True)
        fs.pipe_file(f"{folder}/step_{step:08d}.json", json.dumps(metrics, sort_keys=True).encode())
        self._store.mark_step_generated(step)
        release_claim(self._spec.run, step)
        yield metrics


def read_step_metrics(rollout_root: str, run: str) -> list[dict]:
    """Every step's rollout metrics written so far, by step."""
    fs, folder = fsspec.core.url_to_fs(f"{rollout_root}/{run}-metrics")
    try:
        files = sorted(fs.glob(f"{folder}/step_*.json"))
    except FileNotFoundError:
        return []
    return [json.loads(fs.cat_file(f)) for f in files]


StepSummary = beam.typehints.KV[int, dict]


class RolloutStream(beam.PTransform):
    """ticks (main input) + latest version (side input PCollection) -> rollout groups in the store."""

    def __init__(self, spec: RolloutSpec):
        super().__init__()
        self._spec = spec

    def expand(self, ticks_and_version):
        ticks, latest = ticks_and_version
        spec = self._spec
        version = beam.pvalue.AsList(latest)  # not AsSingleton: a second pane of a window must not fail the stream
        scored = (
            ticks
            | "ScheduleSteps" >> beam.ParDo(ScheduleSteps(spec), version)
            | "Redistribute" >> beam.Reshuffle()
            | "GenerateRollouts" >> beam.ParDo(GenerateRollouts(spec, Shared()), version)
            | "ScoreRollouts" >> beam.ParDo(ScoreRollouts(spec))
        )
        assembled = scored | "AssembleGroups" >> beam.ParDo(AssembleGroups(spec)).with_outputs(
            AssembleGroups.DROPPED, main="kept")
        written = assembled.kept | "WriteGroups" >> beam.ParDo(WriteGroups(spec)).with_output_types(StepSummary)
        finished = (
            (written,
             assembled.dropped | "SummarizeDropped" >> beam.Map(
                 lambda g: (g["key"][0], group_summary(g, written=False))).with_output_types(StepSummary))
            | "AllGroups" >> beam.Flatten()
            | "ByStep" >> beam.GroupByKey()
            | "MarkStepGenerated" >> beam.ParDo(MarkStepGenerated(spec))
        )
        return finished
