"""DAPO's dynamic sampling (Yu et al. 2025, §3.2): train only on groups that carry a learning signal.

A group whose rewards are all equal (all right or all wrong) has zero group-relative advantage and
contributes no gradient; DAPO drops such groups and keeps sampling until the batch holds enough
informative ones. :class:`GroupAccumulator` is that loop's state, free of any I/O so the streaming
pipeline (or a test) drives it::

    accumulator = GroupAccumulator(groups_per_batch=8, max_groups_seen=64)
    while not accumulator.is_full:
        for group in sample_groups(accumulator.groups_needed):   # a group: list of rollout rows
            accumulator.add(group)
    batch = accumulator.take_batch()     # surplus groups stay for the next batch

``max_groups_seen`` bounds the sampling per batch (DAPO's ``max_num_gen_batches``): when that many
groups have been seen without filling the batch, :class:`DynamicSamplingExhausted` is raised
rather than sampling forever on a prompt set the policy has saturated.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence


class DynamicSamplingExhausted(RuntimeError):
    """Too many groups were sampled without finding enough with non-uniform rewards."""


def group_rewards(group: Sequence[dict]) -> list[float]:
    """The rewards of a group given as rollout rows (``rlax_core.data.records.ROLLOUT_SCHEMA``)."""
    rewards = []
    for row in group:
        reward = row.get("reward")
        if reward is None or not math.isfinite(reward):
            raise ValueError(f"rollout {row.get('group_id')}/{row.get('sample_idx')} has no finite reward: {reward!r}")
        rewards.append(float(reward))
    return rewards


def has_reward_variance(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ (a group of one never does)."""
    return len(rewards) > 1 and min(rewards) != max(rewards)


class GroupAccumulator:
    """Collects informative groups until a batch of ``groups_per_batch`` is full.

    Args:
      groups_per_batch: how many groups make a training batch.
      drop_uniform: drop groups whose rewards are all equal (False: accept every group, so the same
        loop serves algorithms without dynamic sampling).
      max_groups_seen: raise :class:`DynamicSamplingExhausted` when this many groups have been added
        for the current batch without filling it; None: no bound.
      rewards_of: how to read a group's rewards (default: rollout rows with a ``reward`` field).
    """

    def __init__(
        self,
        groups_per_batch: int,
        *,
        drop_uniform: bool = True,
        max_groups_seen: Optional[int] = None,
        rewards_of: Callable[[Any], Sequence[float]] = group_rewards,
    ):
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        if max_groups_seen is not None and max_groups_seen < groups_per_batch:
            raise ValueError(f"max_groups_seen ({max_groups_seen}) must be >= groups_per_batch ({groups_per_batch})")
        self.groups_per_batch = groups_per_batch
        self.drop_uniform = drop_uniform
        self.max_groups_seen = max_groups_seen
        self.rewards_of = rewards_of
        self._kept: list[Any] = []
        self.seen_for_batch = 0  # groups added since the last take_batch
        self.total_seen = 0
        self.total_dropped = 0

    def add(self, group: Any) -> bool:
        """Offer one group; returns whether it was kept."""
        if self.max_groups_seen is not None and self.seen_for_batch >= self.max_groups_seen and not self.is_full:
            raise DynamicSamplingExhausted(
                f"saw {self.seen_for_batch} groups but only {len(self._kept)} of the {self.groups_per_batch} "
                "needed had non-uniform rewards; the prompts are too easy or too hard for the policy"
            )
        self.seen_for_batch += 1
        self.total_seen += 1
        if self.drop_uniform and not has_reward_variance(self.rewards_of(group)):
            self.total_dropped += 1
            return False
        self._kept.append(group)
        return True

    @property
    def is_full(self) -> bool:
        return len(self._kept) >= self.groups_per_batch

    @property
    def groups_needed(self) -> int:
        """How many more informative groups the current batch needs (0 when full)."""
        return max(self.groups_per_batch - len(self._kept), 0)

    def take_batch(self) -> list[Any]:
        """The first ``groups_per_batch`` kept groups, in arrival order; the surplus carries over."""
        if not self.is_full:
            raise RuntimeError(f"batch not full: {len(self._kept)} of {self.groups_per_batch} groups")
        batch, self._kept = self._kept[: self.groups_per_batch], self._kept[self.groups_per_batch :]
        self.seen_for_batch = len(self._kept)
        return batch

    def metrics(self) -> dict[str, float]:
        """Counters for the run's metrics (cumulative)."""
        return {
            "dynamic_sampling/groups_seen": float(self.total_seen),
            "dynamic_sampling/groups_dropped": float(self.total_dropped),
            "dynamic_sampling/drop_rate": self.total_dropped / max(self.total_seen, 1),
        }
