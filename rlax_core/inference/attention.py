"""Decode and prefill attention in plain jnp: the decode window's attention (the CPU path), and the
paged reference (gather the pages, then the same math) that the Pallas kernels are tested against.

Shapes: B sequences, Hq query heads, Hkv key/value heads (GQA: each KV head serves Hq // Hkv
query heads), D head dim, P pages per sequence of S tokens each. Softmax runs in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_core.inference.kv_cache import gather_pages, to_window_layout, values_tokens_minor

_MASKED = -1e30  # finite, so a fully masked row gives zeros instead of NaN


def window_decode_attention(q: jax.Array, keys: jax.Array, values: jax.Array, lengths: jax.Array,
                            scale: float, current: tuple[jax.Array, jax.Array] | None = None,
                            key_scales: jax.Array | None = None, value_scales: jax.Array | None = None) -> jax.Array:
    """One query token per sequence against its first ``lengths[b]`` tokens of a decode window.

    q [B, Hq, D]; keys [B, Hkv, D, T] and values in ``kv_cache.to_window_layout``'s layout.
    ``current``, the query token's own key and value [B, Hkv, D] when they are not in the window
    yet, is attended to as well: the decode loop attends before it writes the window, so that the
    window's only reader is done when the write updates it in place.
    ``key_scales`` / ``value_scales`` [B, Hkv, T]: an eight-bit window's per-token scales
    (``kv_cache``), folded into the products: q . (k * s) = (q . k) * s for a key, and a value's
    scale multiplies its weight, so the window is never widened whole.
    Returns [B, Hq, D] in q's dtype. Nothing to attend to (a length of 0, no ``current``) gives zeros.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads, tokens = keys.shape[1], keys.shape[-1]
    qg = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = jnp.einsum("bhgd,bhdt->bhgt", qg, keys, preferred_element_type=jnp.float32) * scale
    if key_scales is not None:
        scores = scores * key_scales[:, :, None, :]
    visible = (jnp.arange(tokens)[None, :] < lengths[:, None])[:, None, None, :]
    scores = jnp.where(visible, scores, _MASKED)
    # The shift is at least _MASKED / 2, so masked scores give exact zeros even in a row with nothing
    # visible, whose weights then sum to 0 and whose output is 0. One mask, not two: each is a pass
    # over the [.., T] scores. The weights are unnormalised and divided after the value product,
    # which runs the division over [.., D] instead of [.., T].
    shift = jnp.max(scores, axis=-1, keepdims=True)
    if current is not None:
        own_key, own_value = (x.astype(jnp.float32)[:, :, None] for x in current)  # [B, Hkv, 1, D]
        own_score = jnp.sum(qg.astype(jnp.float32) * own_key, axis=-1, keepdims=True) * scale  # [B, Hkv, G, 1]
        shift = jnp.maximum(shift, own_score)
    shift = jnp.maximum(shift, _MASKED / 2)
    weights = jnp.exp(scores - shift)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    spec = "bhgt,bhdt->bhgd" if values_tokens_minor(head_dim) else "bhgt,bhtd->bhgd"
    scaled_weights = weights if value_scales is None else weights * value_scales[:, :, None, :]
    out = jnp.einsum(spec, scaled_weights, values.astype(jnp.float32), preferred_element_type=jnp.float32)
    if current is not None:
        own_weight = jnp.exp(own_score - shift)
        out, total = out + own_weight * own_value, total + own_weight
    out = out / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
    return out.reshape(batch, num_heads, head_dim).astype(q.dtype)


def paged_decode_attention_reference(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, page_table: jax.Array,
                                     lengths: jax.Array, scale: float, k_scale_pool: jax.Array | None = None,
                                     v_scale_pool: jax.Array | None = None) -> jax.Array:
    """One query token per sequence against that sequence's first ``lengths[b]`` cached tokens.

    q [B, Hq, D]; k_pool, v_pool one layer's [Hkv, num_pages, S, D] (``kv_cache``), with their
    scale pools [Hkv, num_pages, S] when eight-bit; page_table [B, P]; lengths [B]. Returns
    [B, Hq, D] in q's dtype.
    """
    keys, values = to_window_layout(gather_pages(k_pool, page_table), gather_pages(v_pool, page_table))
    scales = [None if pool is None else gather_pages(pool, page_table).transpose(1, 0, 2)
              for pool in (k_scale_pool, v_scale_pool)]
    return window_decode_attention(q, keys, values, lengths, scale, key_scales=scales[0], value_scales=scales[1])


def prefill_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, scale: float) -> jax.Array:
    """Causal self-attention of fresh prompts on themselves: q [B, T, Hq, D], k/v [B, T, Hkv, D].

    ``key_valid`` [B, T] marks real tokens; prompts are left-padded so that every row's last column
    is its last real token, and the mask keeps real tokens from seeing the padding before them.
    """
    batch, length, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    qg = q.reshape(batch, length, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
    visible = jnp.tril(jnp.ones((length, length), bool))[None] & key_valid[:, None, :]
    scores = jnp.where(visible[:, None, None], scores, _MASKED)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(batch, length, num_heads, head_dim).astype(q.dtype)
