"""``StepPacer``: on each tick, the work units of the steps that may be generated now.

A step is offered when the newest committed weight version allows it (``schedule.steps_to_generate``),
it is not complete in the store and no claim holds it (``claims``: in the store, so across the
fleet's processes and VMs). It is offered whole: all its units
at once, so that its groups meet again at the step's last stage; a step partly in the store is
offered whole again, its written groups rewritten under the same names.
"""

from __future__ import annotations

import time

from rlax_core.rollout.claims import StepClaims
from rlax_core.rollout.schedule import WorkUnit, complete_steps, steps_to_generate, work_units
from rlax_core.rollout.spec import RolloutSpec

# (run, version) -> when a scheduler of this process first saw the version (the step's timeline).
_versions_seen: dict[tuple[str, int], float] = {}


class StepPacer:
    def __init__(self, spec: RolloutSpec, claims: StepClaims | None = None):
        self.spec = spec
        self.store = spec.store()
        self.claims = spec.claims() if claims is None else claims
        # Steps found complete in the store stay complete (groups are never removed): the store is
        # listed only on a tick that has a step neither known complete nor in flight, about once
        # per new version, rather than on every tick.
        self._complete: set[int] = set()

    def units(self, latest_version: int) -> list[WorkUnit]:
        """The units of every step ``latest_version`` allows that is neither complete nor claimed; each
        such step is claimed."""
        spec = self.spec
        seen_t = _versions_seen.setdefault((spec.run, latest_version), time.time())
        allowed = steps_to_generate(latest_version, spec.max_staleness, spec.total_steps, self._complete)
        unclaimed = [s for s in allowed if not self.claims.held(spec.run, s)]
        if not unclaimed:
            return []
        self._complete |= complete_steps(self.store, spec.prompts_per_step, unclaimed)
        units = []
        for step in (s for s in unclaimed if s not in self._complete):
            claim = self.claims.try_claim(spec.run, step)
            if not claim:
                continue
            scheduled_t = time.time()
            units += [WorkUnit(step=step, version=latest_version, slots=slots, version_seen_t=seen_t,
                               scheduled_t=scheduled_t, claim=claim)
                      for slots in work_units(spec.prompts_per_step, spec.loop.groups_per_unit)]
        return units
