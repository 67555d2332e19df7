"""DAPO's dynamic sampling (Yu et al. 2025, §3.2): train only on groups that carry a learning signal.

A group whose rewards are all equal has zero group-relative advantage and contributes no gradient;
DAPO drops the groups whose accuracy is 0 or 1 (eq. 11: 0 < |{correct}| < G) and keeps sampling
until the batch holds enough informative ones. Here, with ``algorithm.dynamic_sampling``:

* the rollout stream drops a group whose task rewards are all equal (``is_informative``, called by
  ``rlax_core.rollout.groups``): for a verifier that scores 0 or 1 that is DAPO's accuracy rule, and
  for a graded reward the same "no signal" rule. The task reward is the one before DAPO's overlong
  shaping, which would otherwise tell apart an all-correct group by lengths alone;
* the trainer fills each batch with the next groups in schedule order
  (``rlax_core.training.job.BatchReader``), so a step whose groups were dropped borrows from later
  steps: DAPO's "keep sampling until the batch is full", over a stream. A policy that saturates its
  prompts leaves the trainer waiting, which fails loudly after ``trainer.wait_timeout_s``.
"""

from __future__ import annotations

from typing import Sequence


def has_reward_variance(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ (a group of one never does)."""
    return len(rewards) > 1 and min(rewards) != max(rewards)


def is_informative(task_rewards: Sequence[float]) -> bool:
    """Whether DAPO's dynamic sampling keeps a group with these task rewards (before overlong shaping)."""
    return has_reward_variance(task_rewards)
