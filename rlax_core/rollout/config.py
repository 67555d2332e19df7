"""``LoopConfig``: the rollout side of the online loop (YAML section ``loop:``, ``loop.KEY=VALUE``).

The trainer's section owns what both halves share (``trainer.groups_per_step`` prompts per step,
``trainer.total_steps``, ``trainer.max_staleness``); the engine's owns ``engine.max_new_tokens``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import rlax_core.tasks  # noqa: F401  (registers the tasks' reward terms before a config names them: story_word)
from rlax_core.config import require
from rlax_core.envs.base import EnvConfig
from rlax_core.rewards.config import RewardConfig


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The rollout side of the online loop (``loop.KEY=VALUE`` on the command line)."""

    train_set: str = ""  # parquet file or folder of Example rows (the difficulty filter's output)
    samples_per_prompt: int = 8  # the group of GRPO-like advantages
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # besides the tokenizer's EOS
    # No default: what the rollouts are scored by is the recipe's to say (``named_rewards``).
    rewards: Optional[RewardConfig] = None
    drop_uniform_groups: bool = False  # DAPO dynamic sampling
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

    def __post_init__(self):
        require(self.samples_per_prompt >= 1, "samples_per_prompt", "at least 1")
        require(self.temperature > 0, "temperature", "> 0 (RL samples; greedy gives identical groups)")
        require(0 < self.top_p <= 1, "top_p", "in (0, 1]")
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

    @property
    def judge_answer(self) -> bool:
        """Whether the reward terms score every sample: always for single-turn rollouts, for episodes
        as ``env.judge_answer`` says."""
        return self.env is None or self.env.judge_answer

    def named_rewards(self) -> RewardConfig:
        """The rollouts' reward; a recipe that names none is refused, with the key to set (a math or code
        recipe would otherwise be trained on a reward meant for another task, without a word)."""
        require(self.rewards is not None, "loop.rewards",
                "name the reward the rollouts are scored by, e.g. loop.rewards.terms={task: 1.0} (math and code: "
                "the example's own task verifier) or {story_word: 1.0} (the quickstart's story task); "
                "docs/rewards.md lists the terms")
        return self.rewards
