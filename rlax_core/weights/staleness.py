"""The staleness rule, in one place for the trainer (which drops stale rollouts) and the rollout side
(which paces itself so that the trainer rarely has to)."""

from __future__ import annotations


def is_fresh_enough(rollout_version: int, train_step: int, max_staleness: int) -> bool:
    """Whether a rollout made by weights of ``rollout_version`` may train at ``train_step``.

    Fresh means ``train_step - max_staleness <= rollout_version <= train_step``; ``max_staleness=0`` is
    strictly on-policy. A version newer than the step is refused too: it only happens after the trainer
    restarted from an older checkpoint, and those rollouts came from weights the trainer no longer has.
    """
    for name, value in (("rollout_version", rollout_version), ("train_step", train_step), ("max_staleness", max_staleness)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return train_step - max_staleness <= rollout_version <= train_step


def oldest_fresh_version(train_step: int, max_staleness: int) -> int:
    """The oldest version the trainer at ``train_step`` still accepts (what the rollout side waits for)."""
    return max(0, train_step - max_staleness)
