"""The rollout fleet as Beam transforms: schedule -> generate -> score -> assemble -> write.

    ticks --ScheduleSteps--> WorkUnit --Reshuffle--> GenerateRollouts --> group --ScoreRollouts (overlong
      shaping) --AssembleGroups (dynamic sampling)--> WriteGroups --> rollout store --MarkStepGenerated
                                                 `-dropped--> RecordDropped (scores, for the curriculum) -'

Each DoFn is a shell over ``rlax_core.rollout``. Work is spread in units of
``loop.groups_per_unit`` prompt groups: pacing allows only steps ``v .. v + k``, so whole steps
would keep at most ``k + 1`` workers busy; reshuffled units spread every step over every worker.

The newest committed weight version reaches ``ScheduleSteps`` and ``GenerateRollouts`` as a slowly
updating side input (``transforms.live_side_input``), the same value in both for a window.
``GenerateRollouts`` keeps one ``RolloutWorker`` per worker process (``apache_beam.utils.shared``):
the model compiles once and every DoFn instance and thread of the process shares it. Every rollout
carries the version that generated it.

Exactly-once at the store: groups are named by ``(run, step, prompt slot)`` only (a retry rewrites the same file).
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Optional

import apache_beam as beam
from apache_beam.utils.shared import Shared
from apache_beam.utils.windowed_value import WindowedValue

from rlax_core.data.rollout_store import GroupKey
from rlax_core.rollout.metrics import group_summary
from rlax_core.rollout.schedule import WorkUnit
from rlax_core.rollout.pacing import StepPacer
from rlax_core.rollout.spec import RolloutSpec
from rlax_core.rollout.busy import Busy
from transforms.reward_stage import PlacedScoring
from transforms.step_marks import MarkStepGenerated, RecordDropped

logger = logging.getLogger(__name__)

# The side input as the stream hands it over (``AsList``): every version in the element's window, as
# a streaming runner may fire a window's pane more than once; empty before the first publish.
SideVersions = list[int]


class ScheduleSteps(beam.DoFn):
    """On each tick, the work units of the steps the latest committed version allows and nobody has
    claimed (``rlax_core.rollout.pacing``)."""

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def setup(self):
        self._scheduler = StepPacer(self._spec)

    def process(self, tick_version: Optional[int], side_versions: SideVersions) -> Iterable[WorkUnit]:
        # A tick carries the version that made it; the side input of its window holds the same once
        # the runner has materialized it (Prism sometimes hands it over before that, empty).
        known = [v for v in (*side_versions, tick_version) if v is not None]
        if known:  # else the trainer has not published its first weights yet (all None)
            yield from self._scheduler.units(max(known))


def acquire_worker(shared: Shared, spec: RolloutSpec):
    """This process's ``RolloutWorker``, built on first use: every DoFn instance holding ``shared`` (or an
    unpickled copy of it) in this process gets the same one."""
    from rlax_core.rollout.worker import RolloutWorker

    return shared.acquire(lambda: RolloutWorker(spec), tag=f"rollout-worker-{spec.run}")


class GenerateRollouts(beam.DoFn):
    """Work units -> one group per prompt slot (``loop.sampling.samples_per_prompt`` samples), stamped with its version.

    The units of a bundle are generated together, an engine call as soon as they would fill the
    engine's slots (and the rest when the bundle ends): small units spread a step over the fleet
    without leaving a worker's engine to decode a handful of sequences at a time. A unit whose step
    the newest usable weights are too old for is deferred: its step's claim is released, so the
    schedule offers the step again once the version is repaired or superseded.
    """

    def __init__(self, spec: RolloutSpec, shared: Shared):
        self._spec, self._shared = spec, shared

    def setup(self):
        spec = self._spec
        with Busy(spec.rollout_root, spec.run, "starting: loading and compiling the engine"):
            self._worker = acquire_worker(self._shared, spec)
        self._examples = spec.examples()
        self._claims = spec.claims()
        self._versions_refused = beam.metrics.Metrics.counter("rollout", "weight_versions_refused")
        self._steps_deferred = beam.metrics.Metrics.counter("rollout", "steps_deferred_no_fresh_weights")
        self._generated = beam.metrics.Metrics.counter("rollout", "groups_generated")

    def start_bundle(self):
        self._pending: list[tuple[WorkUnit, int, WindowedValue]] = []

    def process(self, unit: WorkUnit, side_versions: SideVersions, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        self._pending.append((unit, max([unit.version, *side_versions]), WindowedValue(None, timestamp, [window])))
        sequences = sum(len(u.slots) for u, _, _ in self._pending) * self._spec.loop.sampling.samples_per_prompt
        if sequences >= self._worker.host.capacity:
            yield from self._generate_pending()

    def finish_bundle(self):
        yield from self._generate_pending()

    def _generate_pending(self) -> Iterable[WindowedValue]:
        from rlax_core.rollout.generation import generate_units

        spec, worker = self._spec, self._worker
        pending, self._pending = self._pending, []
        if not pending:
            return
        claims = {u.step: u.claim for u, _, _ in pending}  # renewed while generated, released when deferred
        renewing = self._claims.keep(spec.run, list(claims.items()))
        with Busy(spec.rollout_root, spec.run, f"generating steps {sorted(claims)}"), renewing:
            made = generate_units(worker, self._examples, [(unit, version) for unit, version, _ in pending])
        if made.refused:
            self._versions_refused.inc(made.refused)
            refused = ", ".join(f"{v}: {why}" for v, why in sorted(worker.follower.refused.items()))
            logger.error("rollout worker: %d weight version(s) refused (%s); generating with version %s",
                         made.refused, refused, made.loaded)
        for step in made.deferred_steps:  # too stale for the trainer: wait for a repaired or newer version
            self._steps_deferred.inc()
            logger.warning("rollout worker: step %d needs weights >= %d, the newest usable is %s; deferring it",
                           step, step - spec.max_staleness, made.loaded)
            self._claims.release(spec.run, step, claims[step])  # only the claim it was scheduled under
        for (_, _, place), groups in zip(pending, made.groups):
            for group in groups or ():
                self._generated.inc()
                yield place.with_value(group)


class ScoreRollouts(beam.DoFn):
    """Scores every sample of a group with ``loop.rewards``, then adds DAPO's overlong penalty when
    ``algorithm.overlong_max_length`` is set (``rollout.groups``). A sample that cannot be scored is
    reward 0 with its reason in ``reward_info``, counted in ``rewards/samples_failed``."""

    def __init__(self, spec: RolloutSpec):
        self._spec = spec
        self._failed = beam.metrics.Metrics.counter("rewards", "samples_failed")

    def setup(self):
        from rlax_core.rewards.scorer import Rewarder
        from rlax_core.rollout.samplers import make_sampler

        # Imports the built-in task terms and the config's own reward modules and functions in this
        # worker before building the terms (rlax_core.rewards.custom).
        self._rewarder = Rewarder(self._spec.rewards)
        self._sampler = make_sampler(self._spec)  # completions or episodes: how their rows are scored

    def teardown(self):
        self._rewarder.close()

    def process(self, group: dict):
        from rlax_core.rollout.groups import shape_overlong

        scored, failed = self._sampler.score(self._rewarder, group)
        scored = shape_overlong(self._spec.algorithm, scored)
        self._failed.inc(failed)
        yield {**scored, "timeline": {**group.get("timeline", {}), "scored_t": time.time()}}


class AssembleGroups(beam.DoFn):
    """DAPO dynamic sampling at the group level: with ``algorithm.dynamic_sampling``, a group whose
    task rewards are all equal (no learning signal) goes to the ``dropped`` output instead of the store."""

    DROPPED = "dropped"

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def process(self, group: dict):
        from rlax_core.rollout.groups import keeps_group

        if keeps_group(self._spec.algorithm, group):
            yield group
        else:
            yield beam.pvalue.TaggedOutput(self.DROPPED, group)


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


StepSummary = beam.typehints.KV[int, dict]


class RolloutStream(beam.PTransform):
    """ticks (main input) + latest version (side input PCollection) -> rollout groups in the store."""

    def __init__(self, spec: RolloutSpec, shared: Shared | None = None):
        super().__init__()
        self._spec = spec
        self._shared = shared or Shared()  # one engine per process (a test may pass its own to reuse one)

    def expand(self, ticks_and_version):
        ticks, latest = ticks_and_version
        spec = self._spec
        version = beam.pvalue.AsList(latest)  # not AsSingleton: a second pane of a window must not fail the stream
        scored = (
            ticks
            | "ScheduleSteps" >> beam.ParDo(ScheduleSteps(spec), version)
            | "Redistribute" >> beam.Reshuffle()
            | "GenerateRollouts" >> beam.ParDo(GenerateRollouts(spec, self._shared), version)
            | "Score" >> PlacedScoring(ScoreRollouts(spec), spec.rewards)
        )
        assembled = scored | "AssembleGroups" >> beam.ParDo(AssembleGroups(spec)).with_outputs(
            AssembleGroups.DROPPED, main="kept")
        written = assembled.kept | "WriteGroups" >> beam.ParDo(WriteGroups(spec)).with_output_types(StepSummary)
        return (
            (written,
             assembled.dropped | "RecordDropped" >> beam.ParDo(RecordDropped(spec)).with_output_types(StepSummary))
            | "AllGroups" >> beam.Flatten()
            | "ByStep" >> beam.GroupByKey()
            | "MarkStepGenerated" >> beam.ParDo(MarkStepGenerated(spec))
        )
