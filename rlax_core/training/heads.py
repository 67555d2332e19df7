"""What the trained model puts out at each position, chosen once by its config: a causal language
model's log-prob of the next token (``logprobs.token_logprobs``), or a reward model's score
(``ModelConfig.score_head``: ``reward_model.position_scores``, the score head on each position's
hidden state). The trainer, its frozen LoRA base and ``rlax compile`` build, shard and run the
model through these functions alone, so an objective that reads scores (``bradley_terry``) runs
on the same packed rows, micro-batches, LoRA and checkpoints as one that reads log-probs.

With LoRA the score head is trained beside the adapters (PEFT's ``modules_to_save=["score"]``): a
head left frozen at its zero start would score every sequence 0.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import init_params, param_logical_axes
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.reward_model import init_reward_params, position_scores, reward_logical_axes

HEAD = "score"  # the trainable head of a reward model: its own entry of the trainable tree under LoRA


def init_model(config: ModelConfig, rng: jax.Array, dtype=jnp.float32) -> Any:
    """A random model of ``config``: a language model, or a reward model with a zero score head."""
    params = init_params(config, rng, dtype)
    return init_reward_params(params) if config.score_head else params


def model_logical_axes(config: ModelConfig) -> Any:
    return reward_logical_axes(config) if config.score_head else param_logical_axes(config)


def token_outputs(params, config: ModelConfig, tokens, *, lora_dropout: float = 0.0, lora_dropout_rng=None,
                  routed_experts=None, **options) -> tuple[jax.Array, jax.Array]:
    """[B, T-1] float32 twice: the log-probs of the next tokens and their distributions' entropy, or
    for a reward model each position's score and zeros (a score has no distribution)."""
    if not config.score_head:
        return token_logprobs(params, config, tokens, lora_dropout=lora_dropout, lora_dropout_rng=lora_dropout_rng,
                              routed_experts=routed_experts, **options)
    scores = position_scores(params, config, tokens, **options)
    return scores, jnp.zeros_like(scores)


def trainable_head(config: ModelConfig) -> dict[str, Any]:
    """The head trained beside LoRA's adapters (a reward model's zero score head), or nothing."""
    if not config.score_head:
        return {}
    return {HEAD: {"kernel": jnp.zeros((config.hidden_size,), jnp.float32)}}


def trainable_head_axes(config: ModelConfig) -> dict[str, Any]:
    return {HEAD: {"kernel": ("embed",)}} if config.score_head else {}


def split_head(trainable: Any) -> tuple[Any, dict[str, Any]]:
    """A LoRA state's trainable tree as (the adapters, the trained head to put in the base's place)."""
    return {k: v for k, v in trainable.items() if k != HEAD}, {k: v for k, v in trainable.items() if k == HEAD}
