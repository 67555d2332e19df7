"""Token selection: greedy, temperature, top-k, top-p; keys derived per sample; behavior log-probs.

Reproducibility: the key of token ``t`` of sample ``i`` of prompt ``p`` under run seed ``s`` is
``fold_in(fold_in(fold_in(key(s), p), i), t)``. It depends on nothing else (not the slot, not the
other sequences in the batch, not when the request was admitted), so any single rollout can be
regenerated exactly from its (seed, prompt id, sample index).

Log-probs: every sampled token is returned with ``log_softmax(logits)[token]`` computed in float32
from the model's raw logits: no temperature, no top-k/top-p truncation. That is the policy
distribution pi(token | context) that the trainer recomputes, so behavior and trainer log-probs
agree up to numerics whatever sampling settings produced the token. (The distribution the token
was actually drawn from is the tempered, truncated one; importance corrections that need it must
account for the difference.)
"""

from __future__ import annotations

import enum
import zlib

import jax
import jax.numpy as jnp


class SamplingMode(enum.IntEnum):
    """What a decode program must be able to do; a batch uses the most general mode any row needs.

    Each mode is one compiled program: greedy-only batches skip the random draws, and only batches
    with top-k/top-p pay for sorting the vocabulary.
    """

    GREEDY = 0
    TEMPERATURE = 1
    FILTERED = 2


def prompt_key_id(prompt_id: int | str) -> int:
    """A prompt id as the 31-bit integer folded into its keys (strings hash stably with CRC-32)."""
    if isinstance(prompt_id, str):
        return zlib.crc32(prompt_id.encode("utf-8")) & 0x7FFFFFFF
    if isinstance(prompt_id, int) and prompt_id >= 0:
        return prompt_id & 0x7FFFFFFF
    raise ValueError(f"prompt id must be a string or a non-negative int, got {prompt_id!r}")


def sample_key(seed: jax.Array, prompt_id: jax.Array, sample_index: jax.Array, token_index: jax.Array) -> jax.Array:
    """The key of one token of one sample (all arguments int32 scalars; vmap for a batch)."""
    key = jax.random.key(seed.astype(jnp.uint32))
    for part in (prompt_id, sample_index, token_index):
        key = jax.random.fold_in(key, part.astype(jnp.uint32))
    return key


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """float32 log_softmax of the raw logits [B, V] at ``tokens`` [B]."""
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


def _filter_top_k_top_p(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Tempered logits sorted descending with the tokens outside top-k / nucleus masked, and the order."""
    order = jnp.argsort(-scaled, axis=-1)
    ranked = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(scaled.shape[-1])[None, :]
    probs = jax.nn.softmax(ranked, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # Keep the smallest prefix whose mass reaches top_p (the first token always), and at most top_k.
    keep = (mass_before < top_p[:, None]) | (rank == 0)
    keep &= (top_k[:, None] == 0) | (rank < top_k[:, None])
    return jnp.where(keep, ranked, -jnp.inf), order


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                  mode: SamplingMode) -> tuple[jax.Array, jax.Array]:
    """Pick one token per row of ``logits`` [B, V]; return (tokens [B] int32, log-probs [B] float32).

    Rows with temperature 0 are greedy in every mode. ``keys`` is a [B] array of typed keys.
    """
    logits = logits.astype(jnp.float32)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if mode == SamplingMode.GREEDY:
        return greedy, token_logprobs(logits, greedy)
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    if mode == SamplingMode.FILTERED:
        ranked, order = _filter_top_k_top_p(scaled, top_k, top_p)
        picked_rank = jax.vmap(jax.random.categorical)(keys, ranked)
        sampled = jnp.take_along_axis(order, picked_rank[:, None], axis=-1)[:, 0]
    else:
        sampled = jax.vmap(jax.random.categorical)(keys, scaled)
    tokens = jnp.where(temperature > 0, sampled.astype(jnp.int32), greedy)
    return tokens, token_logprobs(logits, tokens)
