"""``LoopConfig``: the rollout side of the online loop (YAML section ``loop:``, ``loop.KEY=VALUE``).

The trainer's section owns what both halves share (``trainer.groups_per_step`` prompts per step,
``trainer.total_steps``, ``trainer.max_staleness``); the algorithm's owns what the stream does to
a scored group (DAPO's overlong shaping and dynamic sampling); the engine's owns the compiled
budget ``engine.max_new_tokens``, which ``loop.sampling.max_new_tokens`` defaults to.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Optional

import rlax_core.tasks  # noqa: F401  (registers the tasks' reward terms before a config names them: story_word)
from rlax_core.config import require
from rlax_core.envs.base import EnvConfig
from rlax_core.rollout.curriculum import CurriculumConfig
from rlax_core.inference.config import SAMPLING_KEYS, SamplingConfig
from rlax_core.rewards.config import RewardConfig


@dataclasses.dataclass(frozen=True)
class ResponseLengths:
    """The completion lengths a recipe expects, for sizing (``rlax plan``, the fleet simulator), not
    for running: ``measured`` lengths (from an earlier run's rollouts), else a ``mean`` and a ``cap``
    (0: half the sampling budget, and the budget), lengths then taken as exponential about the mean
    and cut at the cap (reasoning samples: most stop early, a few run to the budget)."""

    mean: int = 0
    cap: int = 0
    measured: tuple[int, ...] = ()

    def __post_init__(self):
        require(self.mean >= 0 and self.cap >= 0, "response_lengths", "mean and cap must be >= 0 (0: from the budget)")
        require(all(n >= 1 for n in self.measured), "response_lengths.measured", "lengths of at least 1 token")
        require(not self.cap or self.mean <= self.cap, "response_lengths.mean", f"at most the cap {self.cap}")

    def sample(self, budget: int, points: int = 512) -> list[int]:
        """Lengths that stand for the distribution: the measured ones cut at the budget, or ``points``
        quantiles of the cut exponential whose mean is ``mean``."""
        cap = min(self.cap or budget, budget)
        if self.measured:
            return [min(n, cap) for n in self.measured]
        mean = min(self.mean or budget // 2, cap)
        quantiles = [(i + 0.5) / points for i in range(points)]
        cut = lambda scale: [min(cap, max(1, round(-scale * math.log1p(-u)))) for u in quantiles]
        low, high = 1.0, 64.0 * cap  # the cut lowers the mean: find the scale whose cut mean is ``mean``
        for _ in range(60):
            scale = (low + high) / 2
            low, high = (scale, high) if sum(cut(scale)) / points < mean else (low, scale)
        return cut((low + high) / 2)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The rollout side of the online loop (``loop.KEY=VALUE`` on the command line)."""

    RENAMED: ClassVar[dict[str, str]] = {"samples_per_prompt": "sampling.samples_per_prompt",
                                         **{key: f"sampling.{key}" for key in SAMPLING_KEYS}}
    REMOVED: ClassVar[dict[str, str]] = {
        "drop_uniform_groups": "moved: DAPO's dynamic sampling is algorithm.dynamic_sampling (the dapo preset sets it)"}

    train_set: str = ""  # parquet file or folder of Example rows (the difficulty filter's output)
    # How the rollouts sample: samples_per_prompt is the group of GRPO-like advantages; stop ids and
    # strings end a sample besides the tokenizer's EOS.
    sampling: SamplingConfig = SamplingConfig()
    # No default: what the rollouts are scored by is the recipe's to say (``named_rewards``).
    rewards: Optional[RewardConfig] = None
    # Multi-turn: each sample is an episode of this environment (docs/multi_turn.md); None: one completion.
    env: EnvConfig | None = None
    groups_per_unit: int = 1  # prompt groups per work unit: every worker of the fleet shares every step
    # How often the stream reads the weight store's newest version: a new one is seen and scheduled
    # within about this long (transforms.live_side_input). Listing a bucket costs; a local folder little.
    poll_interval_s: float = 1.0
    heartbeat_s: float = 1.0  # the schedule also ticks this often without a new version (re-offers deferred steps)
    max_runtime_s: float = 3600.0  # the impulses stop after this: a forgotten pipeline ends by itself
    # How often the driver reads the rollout store to see the run end or the stream stall; apart from
    # poll_interval_s so that a short side-input refresh does not shorten the stall window or add listings.
    watch_interval_s: float = 1.0
    stall_polls: int = 300  # watch polls with steps waiting and no group written: the stream has stalled
    # Start-up is not a stall: stall polls count only once a worker's engine is compiled. Until then the
    # fleet has this long to come up (VMs, image, weights, compilation: minutes on Dataflow, seconds
    # here); past it the driver stops with the phase the fleet was in. The trainer waits at least as long.
    startup_budget_s: float = 600.0
    # How long the fleet takes to generate one step at the recipe's sizes. A claim on a step in flight
    # lives twice this (renewed while a worker generates it): a slow step is not offered twice, and a
    # lost one (a dropped bundle, a killed worker) is offered again after that long.
    expected_step_s: float = 300.0
    response_lengths: ResponseLengths = ResponseLengths()
    # Which prompts each step draws, by how the policy does on them now (docs/curriculum.md).
    curriculum: CurriculumConfig = CurriculumConfig()

    def __post_init__(self):
        require(self.sampling.temperature > 0, "sampling.temperature", "> 0 (RL samples; greedy gives identical groups)")
        require(self.groups_per_unit >= 1, "groups_per_unit", "at least 1")
        require(self.poll_interval_s > 0, "poll_interval_s", "> 0")
        require(self.heartbeat_s > 0, "heartbeat_s", "> 0")
        require(self.max_runtime_s > 0, "max_runtime_s", "> 0")
        require(self.watch_interval_s > 0, "watch_interval_s", "> 0")
        require(self.stall_polls >= 1, "stall_polls", "at least 1")
        require(self.startup_budget_s > 0, "startup_budget_s", "> 0")
        require(self.expected_step_s > 0, "expected_step_s", "> 0")

    def require_train_set(self) -> None:
        """``rlax rollout`` and ``rlax launch`` refuse, alike, a loop that names no training prompts."""
        require(bool(self.train_set), "loop.train_set",
                "say which prompts to train on: --train-set PATH (or loop.train_set=PATH)")

    def named_rewards(self) -> RewardConfig:
        """The rollouts' reward; a recipe that names none is refused, with the key to set (a math or code
        recipe would otherwise be trained on a reward meant for another task, without a word)."""
        require(self.rewards is not None, "loop.rewards",
                "name the reward the rollouts are scored by, e.g. loop.rewards.terms={task: 1.0} (math and code: "
                "the example's own task verifier) or {story_word: 1.0} (the quickstart's story task); "
                "docs/rewards.md lists the terms")
        return self.rewards
