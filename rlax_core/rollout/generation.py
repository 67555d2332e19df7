"""Work units in, rollout groups out: what ``GenerateRollouts`` does, without Beam.

A group is a plain dict, cheap to pickle between Beam stages: ``key`` (step, prompt slot),
``example``, ``rows`` (Rollout rows, ``rlax_core.data.records``), ``texts`` (the policy text of each
sample, which the reward terms judge: ``samplers``), ``generate_seconds`` (its share of the engine
call), ``worker`` and ``timeline`` (wall clocks of the step's timeline, ``rlax_core.utils.timeline``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from rlax_core.data.rollout_store import GroupKey
from rlax_core.rollout.schedule import WorkUnit
from rlax_core.rollout.worker import RolloutWorker


@dataclasses.dataclass
class GeneratedUnits:
    """Per unit, its groups (or None: the newest usable weights were too old for its step)."""

    units: list[WorkUnit]
    groups: list[list[dict[str, Any]] | None]
    loaded: int | None  # the weight version the engine generated with (None: no usable weights)
    refused: int  # weight versions newly refused while generating

    @property
    def deferred_steps(self) -> list[int]:
        """Steps of units left ungenerated: the schedule offers them again once fresher weights verify."""
        return sorted({unit.step for unit, groups in zip(self.units, self.groups) if groups is None})


def generate_units(worker: RolloutWorker, examples: Sequence[dict], units: Sequence[tuple[WorkUnit, int]]
                   ) -> GeneratedUnits:
    """Generate ``units`` (each with the newest version its thread knows) in one combined engine call.

    A unit may use weights no older than ``step - max_staleness``; the engine generates with the
    newest version any of them knows of (fresher weights only lower staleness).
    """
    spec, sampler = worker.spec, worker.sampler
    store = spec.store()
    per_unit = []  # per unit: [(slot, example)] and its requests
    for unit, _ in units:
        step_rows = worker.draws.rows(unit.step)  # loop.curriculum's rows (uniform: the schedule's permutation)
        slots = [(slot, examples[step_rows[slot]]) for slot in unit.slots]
        per_unit.append((slots, worker.requests(unit.step, slots)))
    batch = worker.generate([(requests, unit.step - spec.max_staleness) for (unit, _), (_, requests)
                             in zip(units, per_unit)], max(version for _, version in units))
    groups_made = sum(len(slots) for (slots, _), result in zip(per_unit, batch.results) if result is not None)
    out: list[list[dict[str, Any]] | None] = []
    for (unit, _), (slots, requests), results in zip(units, per_unit, batch.results):
        if results is None:
            out.append(None)
            continue
        groups, position = [], 0
        for (slot, example), request in zip(slots, requests):  # results: request order, then sample index
            size = sampler.samples_of(request)
            key = GroupKey(unit.step, slot)
            rows, texts = sampler.rows(worker.host, results[position:position + size], example["id"],
                                       store.group_id(key))
            position += size
            groups.append({
                "key": (key.step, key.prompt_index), "example": example, "rows": rows, "texts": texts,
                "generate_seconds": batch.seconds / groups_made, "worker": worker.name,
                "timeline": {"scheduled_version": unit.version, "version_seen_t": unit.version_seen_t,
                             "scheduled_t": unit.scheduled_t, **batch.timeline}})
        out.append(groups)
    return GeneratedUnits([unit for unit, _ in units], out, batch.loaded, batch.refused)
