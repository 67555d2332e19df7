"""Attention over the paged KV cache in plain jnp: the reference the Pallas kernel is tested against.

Shapes: B sequences, Hq query heads, Hkv key/value heads (GQA: each KV head serves Hq // Hkv
query heads), D head dim, P pages per sequence of S tokens each. Softmax runs in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MASKED = -1e30  # finite, so a fully masked row gives zeros instead of NaN


def paged_decode_attention_reference(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                                     lengths: jax.Array, scale: float, layer: jax.Array | int | None = None) -> jax.Array:
    """One query token per sequence against that sequence's first ``lengths[b]`` cached tokens.

    q [B, Hq, D]; k_pages, v_pages [num_pages, S, Hkv, D], or all layers' pools
    [num_layers, num_pages, S, Hkv, D] with ``layer`` naming one (gathering straight from the
    full pool avoids copying a layer's slice out of it first); page_table [B, P]; lengths [B].
    Returns [B, Hq, D] in q's dtype.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_pages.shape[-2]
    group = num_heads // num_kv_heads
    # [B, P, S, Hkv, D] -> [B, P*S, Hkv, D]: the sequence's tokens in order. Page ids come from the
    # allocator, so they are in bounds and the gather needs no clamping.
    index = page_table if layer is None else (layer, page_table)
    k = k_pages.at[index].get(mode="promise_in_bounds").reshape(batch, -1, num_kv_heads, head_dim)
    v = v_pages.at[index].get(mode="promise_in_bounds").reshape(batch, -1, num_kv_heads, head_dim)
    qg = q.reshape(batch, 1, num_kv_heads, group, head_dim).astype(jnp.float32)
    # A broadcast multiply-sum rather than einsum: with one query token and small head groups the
    # CPU backend runs it as one fused loop instead of many tiny batched matmuls.
    scores = (qg * k[:, :, :, None, :].astype(jnp.float32)).sum(-1) * scale  # [B, T, Hkv, G]
    visible = (jnp.arange(k.shape[1])[None, :] < lengths[:, None])[:, :, None, None]
    # Zeroing masked weights makes an empty sequence (length 0) attend to nothing: output zeros.
    weights = jnp.where(visible, jax.nn.softmax(jnp.where(visible, scores, _MASKED), axis=1), 0.0)
    out = (weights[..., None] * v[:, :, :, None, :].astype(jnp.float32)).sum(1)  # [B, Hkv, G, D]
    return out.reshape(batch, num_heads, head_dim).astype(q.dtype)


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
