"""``RewardConfig``: which reward terms, their weights, and how each verifier runs.

In YAML (the ``rewards`` section of a run)::

    rewards:
      terms: {math: 1.0, format_boxed: 0.1}
      math: {workers: 2, timeout_seconds: 5}
      code: {workers: 2, per_test_seconds: 5, limits: {memory_bytes: 1073741824}}
      sql: {workers: 2, executes_credit: 0.1, limits: {deadline_s: 5}}   # docs/sql.md
      modules: [my_project.rewards]                     # a user's own terms (docs/rewards.md)
      functions: {concise: "my_rewards.py:concise"}      # a plain function as a term
      distillation: {teacher: runs/teacher/hf, weight: 1.0}   # per-token rewards from a teacher

The reward of a sample is ``sum(weight * term score)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from rlax_core.config import ConfigError, require
from rlax_core.rewards.answers import EXTRACTION_METHODS
from rlax_core.rewards.distillation import DistillationConfig
from rlax_core.rewards.judge import JudgeConfig
from rlax_core.rewards.reward_model import RewardModelConfig, placed_models
from rlax_core.rewards.custom import RewardImportError, function_reward, import_reward_module, register_function_reward
from rlax_core.rewards.math_verifier import MathVerifierConfig
from rlax_core.rewards.registry import reward_names
from rlax_core.rewards.sql_match import SqlRewardConfig
from rlax_core.sandbox.run import SandboxLimits


@dataclasses.dataclass(frozen=True)
class CodeRewardConfig:
    workers: int = 2  # sandboxes running at once
    per_test_seconds: float = 5.0  # each test's alarm inside the sandbox; limits.wall_seconds caps the whole run
    partial_credit: bool = False  # score = fraction of tests passed, instead of 1 only when all pass
    limits: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)

    def __post_init__(self):
        require(self.workers >= 1, "workers", "must be >= 1")
        require(0 < self.per_test_seconds <= self.limits.wall_seconds, "per_test_seconds",
                "must be > 0 and at most limits.wall_seconds")


@dataclasses.dataclass(frozen=True)
class FormatConfig:
    think_open: str = "<think>"
    think_close: str = "</think>"

    def __post_init__(self):
        require(bool(self.think_open) and bool(self.think_close), "think_open", "tags must be non-empty")


OVERLONG_MOVED = ("moved: DAPO's overlong shaping is algorithm.overlong_max_length, overlong_cache_length and "
                  "overlong_penalty (the rollout stream applies it to every reward; the dapo preset sets it)")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    REMOVED: ClassVar[dict[str, str]] = {"overlong": OVERLONG_MOVED}

    terms: dict[str, float] = dataclasses.field(default_factory=lambda: {"task": 1.0})
    # A user's own rewards (rlax_core.rewards.custom): modules or .py files that register terms, and
    # functions registered under a name, {NAME: "MODULE_OR_FILE:FUNCTION"}; both may then be named in terms.
    modules: tuple[str, ...] = ()
    functions: dict[str, str] = dataclasses.field(default_factory=dict)
    extraction: tuple[str, ...] = EXTRACTION_METHODS  # math answer extraction, tried in this order
    math: MathVerifierConfig = dataclasses.field(default_factory=MathVerifierConfig)
    code: CodeRewardConfig = dataclasses.field(default_factory=CodeRewardConfig)
    format: FormatConfig = dataclasses.field(default_factory=FormatConfig)
    reward_model: RewardModelConfig = dataclasses.field(default_factory=RewardModelConfig)  # docs/reward_models.md
    judge: JudgeConfig = dataclasses.field(default_factory=JudgeConfig)
    sql: SqlRewardConfig = dataclasses.field(default_factory=SqlRewardConfig)  # the sql term (docs/sql.md)
    # On-policy distillation: a teacher's per-token rewards beside the terms (docs/post_training.md).
    distillation: DistillationConfig = dataclasses.field(default_factory=DistillationConfig)

    def __post_init__(self):
        for index, spec in enumerate(self.modules):
            try:
                import_reward_module(spec)
            except RewardImportError as error:
                raise ConfigError(f"modules[{index}]", str(error)) from None
        for name, spec in self.functions.items():
            try:
                register_function_reward(name, function_reward(spec))
            except (RewardImportError, ValueError) as error:  # ValueError: the name is taken
                raise ConfigError(f"functions.{name}", str(error)) from None
        known = reward_names()
        require(len(self.terms) > 0, "terms", f"at least one reward term; known: {', '.join(known)}")
        for name, weight in self.terms.items():
            require(name != "overlong" or name in known, "terms.overlong", OVERLONG_MOVED)
            require(name in known, f"terms.{name}", f"unknown reward; known: {', '.join(known)}")
            require(math.isfinite(weight), f"terms.{name}", "weight must be a finite number")
        for name in ("reward_model", "judge"):  # the learned terms need their model
            require(name not in self.terms or bool(getattr(self, name).path), f"{name}.path",
                    f"the {name} term needs a model folder")
        placed = sorted(name for name, settings in placed_models(self).items() if settings.placement == "own_stage")
        if len({repr(sorted(getattr(self, name).resource_hints.items())) for name in placed}) > 1:
            raise ConfigError(f"{placed[-1]}.resource_hints", f"the scoring runs on one stage of its own: give "
                                                             f"{' and '.join(placed)} the same resource_hints")
        require(len(self.extraction) > 0 and all(m in EXTRACTION_METHODS for m in self.extraction), "extraction",
                f"a non-empty list of {', '.join(EXTRACTION_METHODS)}")
