"""The reward model's forward as ``rlax compile`` compiles it: the ``reward_model`` term's own jitted
``sequence_scores`` over a full batch of its longest rows ([batch_size, max_length]: the term pads
every batch to ``batch_size`` rows and its length to a power of two at most ``max_length``), with the
weights whole on one chip, as the term holds them (``rewards.reward_model``): on a rollout worker
beside the engine, or on a worker of its own scoring stage."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from rlax_core.compile.programs import Program
from rlax_core.models.config import ModelConfig
from rlax_core.training.heads import init_model
from rlax_core.training.reward_model import sequence_scores
from rlax_core.utils.dtypes import dtype as dtype_named

PROGRAM = "reward model forward"  # the program names' beginning (``rlax compile --programs``)


def reward_model_programs(model: ModelConfig, batch: int, length: int, dtype: str, devices: Sequence[jax.Device],
                          role: str) -> list[Program]:
    """The scoring forward of a reward model of ``model``'s shape (a score head) on ``devices[0]``."""
    if not model.score_head:
        raise ValueError("reward_model_programs: the model has no score head (ModelConfig.score_head)")
    sharding = SingleDeviceSharding(devices[0])
    shapes = jax.eval_shape(lambda: init_model(model, jax.random.key(0)))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype_named(dtype), sharding=sharding), shapes)
    rows = jax.ShapeDtypeStruct((batch, length), np.int32, sharding=sharding)
    forward = jax.jit(lambda p, tokens, mask: sequence_scores(p, model, tokens, mask))
    return [Program(role, f"{PROGRAM} {batch}x{length}", lambda: forward.lower(params, rows, rows))]
