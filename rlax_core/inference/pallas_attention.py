"""Paged decode attention as a Pallas kernel.

One program per (sequence, KV head): it walks only the pages that hold the sequence's tokens
(``ceil(length / page_size)`` of them, read through the page table) with an online softmax, and
serves all the query heads of its GQA group at once, so each cached page is read once per KV head
rather than once per query head and nothing is read past a sequence's real length.

``interpret=True`` runs the same kernel through the Pallas interpreter (CPU, tests); otherwise it
is lowered for the backend (Mosaic on TPU, Triton on GPU). It matches
:func:`rlax_core.inference.attention.paged_decode_attention_reference`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_MASKED = -1e30


def _kernel(lengths_ref, page_table_ref, q_ref, k_ref, v_ref, out_ref, *, scale: float, page_size: int):
    seq, kv_head = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[seq]
    q = q_ref[...].astype(jnp.float32) * scale  # [G, D]
    group, head_dim = q.shape

    def visit_page(i, carry):
        running_max, running_sum, acc = carry
        page = page_table_ref[seq, i]
        k = k_ref[page, :, kv_head, :].astype(jnp.float32)  # [S, D]
        v = v_ref[page, :, kv_head, :].astype(jnp.float32)
        scores = jnp.dot(q, k.T, preferred_element_type=jnp.float32)  # [G, S]
        positions = i * page_size + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
        scores = jnp.where(positions < length, scores, _MASKED)
        new_max = jnp.maximum(running_max, scores.max(axis=1, keepdims=True))
        correction = jnp.exp(running_max - new_max)
        probs = jnp.exp(scores - new_max)
        running_sum = running_sum * correction + probs.sum(axis=1, keepdims=True)
        acc = acc * correction + jnp.dot(probs, v, preferred_element_type=jnp.float32)
        return new_max, running_sum, acc

    init = (jnp.full((group, 1), _MASKED, jnp.float32), jnp.zeros((group, 1), jnp.float32),
            jnp.zeros((group, head_dim), jnp.float32))
    num_pages = (length + page_size - 1) // page_size
    _, total, acc = jax.lax.fori_loop(0, num_pages, visit_page, init)
    # A sequence of length 0 has total 0: return zeros, like the reference.
    out_ref[...] = (acc / jnp.where(total == 0, 1.0, total)).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def paged_decode_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                           lengths: jax.Array, scale: float, interpret: bool = False) -> jax.Array:
    """q [B, Hq, D]; k_pages, v_pages [num_pages, S, Hkv, D]; page_table [B, P]; lengths [B] -> [B, Hq, D]."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, page_size = k_pages.shape[2], k_pages.shape[1]
    group = num_heads // num_kv_heads
    qg = q.reshape(batch, num_kv_heads, group, head_dim)
    whole = lambda array: pl.BlockSpec(array.shape, lambda b, h: (0,) * array.ndim)
    out = pl.pallas_call(
        functools.partial(_kernel, scale=scale, page_size=page_size),
        grid=(batch, num_kv_heads),
        in_specs=[
            whole(lengths),
            whole(page_table),
            pl.BlockSpec((None, None, group, head_dim), lambda b, h: (b, h, 0, 0)),
            whole(k_pages),
            whole(v_pages),
        ],
        out_specs=pl.BlockSpec((None, None, group, head_dim), lambda b, h: (b, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        interpret=interpret,
        name="paged_decode_attention",
    )(lengths.astype(jnp.int32), page_table.astype(jnp.int32), qg, k_pages, v_pages)
    return out.reshape(batch, num_heads, head_dim)
