"""The prompt schedule: which prompts step ``s`` samples, when step ``s`` may be generated, in what units.

Pure functions (no Beam, no clock), so that a preempted rollout worker, a retried bundle and a test
all compute the same answer:

* :func:`prompt_indices` — the training-set rows of schedule step ``s``: epoch ``e`` walks a
  permutation of the whole set seeded by ``(run seed, e)``, ``prompts_per_step`` rows per step, so
  every prompt is used once per epoch and the order never depends on timing.
* :func:`sample_seed` / :func:`rollout_prompt_id` — the engine derives each sample's PRNG key from
  ``(seed, prompt id, sample index)``; both are functions of ``(run, step, prompt)`` only, so a
  rollout regenerated with the same weights is token for token the same.
* :func:`work_units` — the prompt slots of a step cut into units of ``groups_per_unit`` groups:
  the pieces a fleet shares, so that W workers all work on the few steps pacing allows. Which
  groups a unit holds depends on nothing but the step's size, so the units of a step cover its
  slots exactly once however they are spread.
* :func:`steps_to_generate` — pacing by the latest committed weight version ``v``: the trainer at
  step ``t`` holds weights ``v = t`` and accepts rollouts of versions ``>= t - k``, so generating
  step ``s`` only once ``v >= s - k`` guarantees every rollout of step ``s`` is fresh enough when
  the trainer reaches it (``k = 0`` is synchronous: step ``s`` waits for version ``s``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterable

import numpy as np

from rlax_core.data.rollout_store import RolloutStore


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
    claim: str = dataclasses.field(default="", compare=False)  # the token of its step's claim (claims.py)


def mix_seed(*parts: object) -> int:
    """A 63-bit integer from its parts (stable across processes, unlike ``hash``)."""
    digest = hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prompt_indices(run_seed: int, step: int, num_prompts: int, prompts_per_step: int) -> list[int]:
    """Rows of the training set sampled at schedule ``step`` (a pure function of its arguments)."""
    if num_prompts < 1 or prompts_per_step < 1 or step < 0:
        raise ValueError(f"need num_prompts >= 1, prompts_per_step >= 1, step >= 0; got "
                         f"{num_prompts}, {prompts_per_step}, {step}")
    first = step * prompts_per_step
    rows = []
    for position in range(first, first + prompts_per_step):
        epoch, offset = divmod(position, num_prompts)
        rows.append(int(_epoch_permutation(run_seed, epoch, num_prompts)[offset]))
    return rows


def _epoch_permutation(run_seed: int, epoch: int, num_prompts: int) -> np.ndarray:
    return np.random.default_rng(mix_seed("epoch", run_seed, epoch)).permutation(num_prompts)


def rollout_prompt_id(run: str, step: int, prompt_slot: int) -> str:
    """The engine's prompt id of one group: the same (run, step, slot) always gives the same keys."""
    return f"{run}/{step}/{prompt_slot}"


def sample_seed(run_seed: int, step: int) -> int:
    """The engine seed of every request of ``step`` (samples differ through prompt id and index)."""
    return mix_seed("rollout", run_seed, step) % (2**31)


def work_units(prompts_per_step: int, groups_per_unit: int) -> list[tuple[int, ...]]:
    """The prompt slots of one step, ``groups_per_unit`` at a time (the last unit may be smaller)."""
    if prompts_per_step < 1 or groups_per_unit < 1:
        raise ValueError(f"need prompts_per_step >= 1 and groups_per_unit >= 1; got {prompts_per_step}, "
                         f"{groups_per_unit}")
    return [tuple(range(first, min(first + groups_per_unit, prompts_per_step)))
            for first in range(0, prompts_per_step, groups_per_unit)]


def steps_to_generate(latest_version: int, max_staleness: int, total_steps: int, done: set[int] | frozenset[int]) -> list[int]:
    """Schedule steps that may be generated now and are not ``done`` yet, oldest first.

    The trainer has finished ``latest_version`` steps, so it next trains step ``latest_version``;
    steps before it are never needed again, steps after ``latest_version + max_staleness`` would be
    too stale by the time the trainer reached them.
    """
    if latest_version < 0 or max_staleness < 0:
        raise ValueError(f"latest_version and max_staleness must be >= 0, got {latest_version}, {max_staleness}")
    last = min(latest_version + max_staleness, total_steps - 1)
    return [s for s in range(latest_version, last + 1) if s not in done]


def complete_steps(store: RolloutStore, prompts_per_step: int, candidates: Iterable[int]) -> set[int]:
    """Which of ``candidates`` are fully generated (a restarted pipeline skips them): every group is in
    the store, or (dynamic sampling may drop groups, even all of them) the step's marker is."""
    keys = store.list_groups()
    return {step for step in candidates if store.is_step_complete(step, prompts_per_step, keys)}
