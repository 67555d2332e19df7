"""The scoring's model forwards as ``rlax compile`` compiles them: a ``reward_model`` term's jitted
``sequence_scores``, or a distillation teacher's ``teacher_token_logprobs``, over a full batch of
its longest rows ([batch_size, max_length]: the scoring pads every batch to ``batch_size`` rows and
its length to a power of two at most ``max_length``), with the weights whole on one chip, as the
scoring holds them (``rewards.reward_model``, ``rewards.distillation``): on a rollout worker beside
the engine, or on a worker of its own scoring stage."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from rlax_core.compile.programs import Program
from rlax_core.models.config import ModelConfig
from rlax_core.rewards.distillation import teacher_token_logprobs
from rlax_core.training.heads import init_model
from rlax_core.training.reward_model import sequence_scores
from rlax_core.utils.dtypes import dtype as dtype_named

PROGRAM = "reward model forward"  # the program names' beginning (``rlax compile --programs``)
TEACHER_PROGRAM = "teacher forward"
SCORING_PROGRAMS = (PROGRAM, TEACHER_PROGRAM)


def reward_model_programs(model: ModelConfig, batch: int, length: int, dtype: str, devices: Sequence[jax.Device],
                          role: str) -> list[Program]:
    """The scoring forward of a model of ``model``'s shape on ``devices[0]``: a reward model's scores
    (a score head) or, for a causal model (a distillation teacher), its log-prob of each token."""
    sharding = SingleDeviceSharding(devices[0])
    shapes = jax.eval_shape(lambda: init_model(model, jax.random.key(0)))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype_named(dtype), sharding=sharding), shapes)
    rows = jax.ShapeDtypeStruct((batch, length), np.int32, sharding=sharding)
    score = sequence_scores if model.score_head else teacher_token_logprobs
    forward = jax.jit(lambda p, tokens, mask: score(p, model, tokens, mask))
    name = PROGRAM if model.score_head else TEACHER_PROGRAM
    return [Program(role, f"{name} {batch}x{length}", lambda: forward.lower(params, rows, rows))]
