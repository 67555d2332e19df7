"""The rollout stream's last stages for a step: a dropped group's scores recorded, and the step's
metrics and marker once every prompt slot is accounted for (``transforms.rollout`` wires them)."""

from __future__ import annotations

import time

import apache_beam as beam

from rlax_core.data.rollout_store import GroupKey
from rlax_core.rollout.metrics import group_summary, step_metrics
from rlax_core.rollout.spec import RolloutSpec


class RecordDropped(beam.DoFn):
    """A group dynamic sampling dropped: its scores are recorded in its step's folder (they still count
    for the curriculum, ``rlax_core.rollout.prompt_state``); yields its summary for its step."""

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def setup(self):
        self._store = self._spec.store()

    def process(self, group: dict):
        from rlax_core.rollout.prompt_state import dropped_record

        step, slot = group["key"]
        self._store.write_dropped_scores(GroupKey(step, slot), dropped_record(group))
        yield step, group_summary(group, written=False)


class MarkStepGenerated(beam.DoFn):
    """Per step (its groups' summaries, written or dropped): write the step's metrics beside the store
    and its ``_GENERATED`` marker once every prompt slot is accounted for. Both are idempotent."""

    def __init__(self, spec: RolloutSpec):
        self._spec = spec

    def setup(self):
        from rlax_core.rollout.drawing import StepDraws

        self._store = self._spec.store()
        self._draws = StepDraws(self._spec)  # imports the loop's curriculum modules in this worker

    def process(self, keyed):
        step, summaries = keyed
        by_slot = {s["slot"]: s for s in summaries}  # a retried bundle may deliver a slot twice
        if len(by_slot) < self._spec.prompts_per_step:
            return
        metrics = step_metrics(step, list(by_slot.values()))
        metrics = {**metrics, **self._draws.metrics(step, metrics["groups_dropped_uniform"], metrics["groups"]),
                   "timeline/marked_t": time.time()}
        self._store.write_step_metrics(step, metrics)
        self._store.mark_step_generated(step)
        self._spec.claims().release(self._spec.run, step)
        yield metrics
