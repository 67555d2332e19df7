"""Continuing a cached sequence: new tokens attend over the pages a sequence already holds.

A multi-turn episode alternates the policy's turns with observations (a tool's output, an
environment's reply). When a turn ends, its sequence keeps its pages; the next turn appends the
observation and continues. ``extend`` runs only the new tokens through the model: it writes their
keys and values into the sequence's pages at their positions and attends, for each new token, over
every cached token at or before it. The history before them is never computed again, which is what
makes a turn cost its own tokens instead of the whole transcript's (``benchmarks/multi_turn.py``).

A prompt prefill (``programs.prefill``) attends only within the call; here the keys come from the
pages, so the same program also serves a sequence re-prefilled from position 0 in chunks (the
engine does that after a weight swap, so that a turn's log-probs come from one version).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlax_core.inference.kv_cache import KVCache, gather_pages, write_pages
from rlax_core.inference.sharding import kv_pool_sharding
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import forward_with_cache

_MASKED = -1e30  # finite: a padding row that sees nothing gets a harmless uniform average


def cached_prefix_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, page_table: jax.Array,
                            positions: jax.Array, scale: float) -> jax.Array:
    """Queries q [B, T, Hq, D] at ``positions`` [B, T] against their sequences' pages.

    k_pool, v_pool: one layer's [Hkv, num_pages, S, D], already holding the new tokens; page_table
    [B, P]. Token t of row b sees the cached tokens at positions <= positions[b, t] (causal over the
    history and the new tokens alike). Softmax in float32. Returns [B, T, Hq, D] in q's dtype.
    """
    batch, length, num_heads, head_dim = q.shape
    keys, values = gather_pages(k_pool, page_table), gather_pages(v_pool, page_table)  # [Hkv, B, K, D]
    num_kv_heads, tokens = keys.shape[0], keys.shape[2]
    qg = q.reshape(batch, length, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = jnp.einsum("bqhgd,hbkd->bhgqk", qg, keys, preferred_element_type=jnp.float32) * scale
    visible = jnp.arange(tokens)[None, None, :] <= positions[:, :, None]  # [B, T, K]
    scores = jnp.where(visible[:, None, None], scores, _MASKED)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhgqk,hbkd->bqhgd", weights.astype(values.dtype), values, preferred_element_type=jnp.float32)
    return out.reshape(batch, length, num_heads, head_dim).astype(q.dtype)


@functools.partial(jax.jit, static_argnames=("model_config", "mesh"), donate_argnames=("cache",))
def extend(params, cache: KVCache, tokens, positions, page_table, *, model_config: ModelConfig,
           mesh=None) -> KVCache:
    """Write tokens [B, T] at ``positions`` [B, T] (-1: padding, sent to the sink page) into their
    sequences' pages, each token attending over its sequence's cache up to itself."""
    valid = positions >= 0
    scale = model_config.head_dim ** -0.5

    def attend(layer, q, k, v, cache: KVCache):
        k_pool = write_pages(cache.k[layer], k, page_table, positions, valid)
        v_pool = write_pages(cache.v[layer], v, page_table, positions, valid)
        cache = KVCache((*cache.k[:layer], k_pool, *cache.k[layer + 1:]), (*cache.v[:layer], v_pool, *cache.v[layer + 1:]))
        return cached_prefix_attention(q, k_pool, v_pool, page_table, positions, scale), cache

    # Only the cache is returned: the compiler drops the classifier.
    _, cache = forward_with_cache(params, model_config, tokens, jnp.maximum(positions, 0), cache, attend,
                                  last_token_only=True)
    if mesh is None:
        return cache
    # A tensor-parallel replica's cache keeps its KV-head sharding through the donation (as ``programs``).
    pin = lambda pool: jax.lax.with_sharding_constraint(pool, kv_pool_sharding(pool.shape, mesh))
    return KVCache(tuple(map(pin, cache.k)), tuple(map(pin, cache.v)))
