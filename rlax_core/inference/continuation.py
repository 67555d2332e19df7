"""Continuing a cached sequence: new tokens attend over the pages a sequence already holds.

A multi-turn episode alternates the policy's turns with observations (a tool's output, an
environment's reply). When a turn ends, its sequence keeps its pages; the next turn appends the
observation and continues. ``extend`` runs only the new tokens through the model: it writes their
keys and values into the sequence's pages at their positions and attends, for each new token, over
every cached token at or before it. The history before them is never computed again, which is what
makes a turn cost its own tokens instead of the whole transcript's (``benchmarks/multi_turn.py``).

A prompt prefill (``programs.prefill``) attends only within the call; here the keys come from the
pages, so the same program also serves a sequence re-prefilled from position 0 in chunks: a turn
whose cache other weights computed, and a sequence resuming after a preemption (its prompt and the
tokens it had sampled, ``feed_uncached``).

A mixture of experts: ``extend`` returns the experts each new token ran too, and ``feed_uncached``
records them at their positions (router replay). A recomputed position's record is overwritten: the
record holds, as the cache does, what the last computation of each position ran (docs/training.md).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.inference.config import EngineConfig
from rlax_core.inference.kv_cache import KVCache, dequantize_tokens, gather_pages, write_layer
from rlax_core.inference.programs import pin_kv_sharding, token_major
from rlax_core.inference.sequences import SequenceState
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import forward_with_cache

_MASKED = -1e30  # finite: a padding row that sees nothing gets a harmless uniform average


def cached_prefix_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, page_table: jax.Array,
                            positions: jax.Array, scale: float, k_scale_pool: jax.Array | None = None,
                            v_scale_pool: jax.Array | None = None) -> jax.Array:
    """Queries q [B, T, Hq, D] at ``positions`` [B, T] against their sequences' pages.

    k_pool, v_pool: one layer's [Hkv, num_pages, S, D], already holding the new tokens; page_table
    [B, P]. Token t of row b sees the cached tokens at positions <= positions[b, t] (causal over the
    history and the new tokens alike). Softmax in float32. Eight-bit pools come with their scale pools
    (``kv_cache``); the gathered tokens are widened (a continuation computes a few tokens per
    sequence, rarely: an episode's turn, a resumed preemption). Returns [B, T, Hq, D] in q's dtype.
    """
    batch, length, num_heads, head_dim = q.shape
    keys, values = gather_pages(k_pool, page_table), gather_pages(v_pool, page_table)  # [Hkv, B, K, D]
    if k_scale_pool is not None:
        keys, values = (dequantize_tokens(x, gather_pages(pool, page_table), q.dtype)
                        for x, pool in ((keys, k_scale_pool), (values, v_scale_pool)))
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
           mesh=None) -> tuple[KVCache, jax.Array | None]:
    """Write tokens [B, T] at ``positions`` [B, T] (-1: padding, sent to the sink page) into their
    sequences' pages, each token attending over its sequence's cache up to itself. Returns (cache,
    routed): a mixture of experts' routed ids [B, T, moe_layers, k], None for a dense model."""
    valid = positions >= 0
    scale = model_config.head_dim ** -0.5

    def attend(layer, q, k, v, cache: KVCache):
        cache = write_layer(cache, layer, k, v, page_table, positions, valid)
        return cached_prefix_attention(q, *cache.layer(layer)[:2], page_table, positions, scale,
                                       *cache.layer(layer)[2:]), cache

    # The classifier's output is not returned: the compiler drops it.
    _, cache, *routing = forward_with_cache(params, model_config, tokens, jnp.maximum(positions, 0), cache, attend,
                                            last_token_only=True, with_routing=model_config.moe is not None,
                                            mesh=mesh)
    routed = token_major(routing[0].expert_ids) if routing else None
    return pin_kv_sharding(cache, mesh), routed


# Feeds tokens [B, T] at positions [B, T] (-1: padding) into the pages of page table [B, P]
# (``extend`` on an engine's weights and cache); returns a mixture of experts' routed ids [B, T,
# moe_layers, k] (None for a dense model).
Extend = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray | None]


def feed_uncached(sequences: list[SequenceState], config: EngineConfig, extend: Extend) -> None:
    """Compute each sequence's tokens from ``cached`` up to, not including, its last (which the
    decode loop feeds) into its pages, in calls of at most one prefill batch and the largest prefill
    bucket (``EngineConfig.prefill_calls``): a long history takes several. A mixture of experts'
    sequences record the experts each computed position ran (``SequenceState.record_routing``), over what an earlier computation recorded."""
    chunk = config.prefill_buckets[-1]
    pending = {id(seq): seq.cached for seq in sequences}
    while True:
        rows = [seq for seq in sequences if pending[id(seq)] < seq.length - 1]
        if not rows:
            return
        spans = [(pending[id(seq)], min(pending[id(seq)] + chunk, seq.length - 1)) for seq in rows]
        for indices, batch, length in config.prefill_calls([end - begin for begin, end in spans], continuation=True):
            group = [(rows[i], spans[i]) for i in indices]
            tokens = np.zeros((batch, length), np.int32)
            positions = np.full((batch, length), -1, np.int32)
            page_table = np.zeros((batch, config.pages_per_sequence), np.int32)
            for row, (seq, (begin, end)) in enumerate(group):
                tokens[row, :end - begin] = seq.fed_tokens(begin, end)
                positions[row, :end - begin] = np.arange(begin, end)
                page_table[row, :len(seq.pages)] = seq.pages
                pending[id(seq)] = end
            routed = extend(tokens, positions, page_table)
            if routed is not None:
                for row, (seq, (begin, end)) in enumerate(group):
                    seq.record_routing(begin, routed[row, :end - begin])
        for seq in sequences:
            seq.cached = pending[id(seq)]
