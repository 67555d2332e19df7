"""Greedy decoding with the default contiguous KV cache: the plain reference the rollout engine must match.

    new_ids = greedy_generate(model, [tokenizer.encode("Once upon a time", add_bos=True)], max_new_tokens=64)

Prompts of different lengths are left-padded; padding gets position -1, so the cache neither stores
nor attends to it. One compiled program does the prefill and a scan over the new tokens.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.models.checkpoint import Model
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import Params, forward_with_cache, init_cache


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens"))
def _greedy(params: Params, config: ModelConfig, prompt_ids: jax.Array, positions: jax.Array,
            stop_ids: jax.Array, max_new_tokens: int) -> jax.Array:
    batch, prompt_len = prompt_ids.shape
    cache = init_cache(config, batch, prompt_len + max_new_tokens, params["embed_tokens"]["embedding"].dtype)
    logits, cache = forward_with_cache(params, config, prompt_ids, positions, cache, last_token_only=True)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    next_position = positions.max(axis=1) + 1

    def step(carry, _):
        token, position, cache = carry
        logits, cache = forward_with_cache(params, config, token[:, None], position[:, None], cache)
        return (jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), position + 1, cache), token

    # The last step computes one token nobody reads; keeping the scan length fixed keeps one compile.
    _, tokens = jax.lax.scan(step, (first, next_position, cache), None, length=max_new_tokens)
    return tokens.T  # [batch, max_new_tokens]


def greedy_generate(model: Model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    stop_token_ids: Sequence[int] | None = None) -> list[list[int]]:
    """Argmax continuation of each prompt, cut before the first stop token (default: the config's EOS ids)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (start from BOS to generate from nothing)")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens}")
    config = model.config
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > config.max_position_embeddings:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"max_position_embeddings ({config.max_position_embeddings})")
    ids = np.zeros((len(prompts), longest), np.int32)
    positions = np.full((len(prompts), longest), -1, np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = prompt
        positions[row, longest - len(prompt):] = np.arange(len(prompt))
    stops = list(config.eos_token_ids if stop_token_ids is None else stop_token_ids)
    new = np.asarray(_greedy(model.params, config, jnp.asarray(ids), jnp.asarray(positions),
                             jnp.asarray(stops or [-1], jnp.int32), max_new_tokens))
    out = []
    for row in new.tolist():
        cut = next((i for i, token in enumerate(row) if token in stops), len(row))
        out.append(row[:cut])
    return out
