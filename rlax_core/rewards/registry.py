"""Reward terms by name: what a term sees, what it returns, and the registry that finds it.

A term is a class registered under a name; it is built once from the :class:`RewardConfig` (so it can
own a process pool) and scores batches, so that pools work on many samples at once::

    @register_reward("mentions_cat")
    class MentionsCat(RewardTerm):
        def score(self, sample):
            hit = "cat" in sample.completion
            return RewardResult(float(hit), {"pass": hit})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence, TypeVar

from rlax_core.sandbox.run import SandboxUnavailable
from rlax_core.utils.registry import Registry


class RewardResult(NamedTuple):
    """A score and a JSON-friendly info record; unpacks as ``reward, info = ...``."""

    score: float
    info: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Sample:
    """One completion to score, with the Example row it answers (``rlax_core.data.records``)."""

    example: Mapping[str, Any]
    completion: str
    finish_reason: str = "stop"  # "stop" or "length"
    num_tokens: int | None = None  # completion length in tokens, for length shaping


class RewardUnavailable(RuntimeError):
    """The scorer itself cannot work: the job stops, loudly, once.

    Anything else a term raises is the failure of one sample, scored 0 with its reason (``Rewarder``).
    """


# What stops a job rather than failing one sample: a term that cannot work, or the sandbox under the
# code verifier that cannot start at all.
SCORER_UNAVAILABLE = (RewardUnavailable, SandboxUnavailable)


def scoring_failure(reason: str) -> RewardResult:
    """A sample that could not be scored: reward 0, not a pass, and why (counted by the ``Rewarder``)."""
    return RewardResult(0.0, {"pass": False, "scoring_error": reason[:500]})


class RewardTerm:
    """A named reward. Implement ``score`` (one sample) or ``score_many`` (a batch, e.g. through a pool)."""

    def __init__(self, config):
        self.config = config  # the run's RewardConfig (rlax_core.rewards.config): weights and verifier settings

    def score(self, sample: Sample) -> RewardResult:
        raise NotImplementedError(f"{type(self).__name__} implements neither score nor score_many")

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        return [self.score(sample) for sample in samples]

    def close(self) -> None:
        """Release pools and processes."""


T = TypeVar("T", bound=type[RewardTerm])
REWARDS: Registry = Registry("reward")


def register_reward(name: str) -> Callable[[T], T]:
    """Class decorator: make a :class:`RewardTerm` selectable as ``rewards.terms.<name>`` in config."""
    return REWARDS.register(name)


def reward_names() -> list[str]:
    """Every registered name: the built-in terms (``import rlax_core.rewards`` registers them) and any other."""
    return sorted(REWARDS)
