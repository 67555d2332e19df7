"""A ``RolloutSpec`` for tests: the loop's and the trainer's keys by their own names, the rest defaulted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlax_core.inference.config import EngineConfig, SamplingConfig
from rlax_core.rewards.config import RewardConfig
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.presets import get_preset
from rlax_core.rollout import LoopConfig, RolloutSpec
from rlax_core.training.config import TrainerConfig
from rlax_core.weights.config import WeightStoreConfig

STORY_REWARD = RewardConfig(terms={"story_word": 1.0})
SAMPLING_FIELDS = tuple(field.name for field in dataclasses.fields(SamplingConfig))


def rollout_spec(root: str | Path = "/unused", *, run: str = "t", model_path: str = "unused", train_set_size: int = 0,
                 engine: EngineConfig = EngineConfig(), weights: WeightStoreConfig | None = None,
                 groups_per_step: int = 1, total_steps: int = 1, max_staleness: int = 0,
                 algorithm: AlgorithmConfig | None = None, **loop) -> RolloutSpec:
    """``loop`` holds ``LoopConfig`` keys (``train_set``, ``rewards``...) and ``SamplingConfig``'s (which
    go into ``loop.sampling``); the story task's reward unless ``rewards`` is given; the grpo preset
    unless ``algorithm`` is given."""
    loop.setdefault("rewards", STORY_REWARD)
    sampling = {key: loop.pop(key) for key in SAMPLING_FIELDS if key in loop}
    if sampling:
        loop["sampling"] = SamplingConfig(**sampling)
    return RolloutSpec(
        run=run, run_seed=0, model_path=model_path, model_dtype="float32", train_set_size=train_set_size,
        rollout_root=f"{root}/rollouts", weights=weights or WeightStoreConfig(root=f"{root}/weights", run_id=run),
        engine=engine, loop=LoopConfig(**loop), algorithm=algorithm or get_preset("grpo"),
        trainer=TrainerConfig(groups_per_step=groups_per_step, total_steps=total_steps, max_staleness=max_staleness))
