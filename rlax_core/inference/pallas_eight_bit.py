"""Paged decode attention over eight-bit pages on TPU: our own Pallas (Mosaic) kernel.

    out = eight_bit_paged_attention(q, k_pool, v_pool, k_scale_pool, v_scale_pool, page_table, lengths,
                                    block_pages=4)

JAX's TPU paged-attention kernel takes eight-bit pages as a ``QuantizedTensor`` whose wrapper
broadcasts the scales to the pages' full width before the call: a float32 array four times the int8
pool, per layer and step. This kernel reads the scale pools as ``kv_cache`` holds them, one float32
per KV head and token slot, ``[Hkv, num_pages, page_size]``: a page's scales are one row of
``page_size`` numbers (one lane-row of HBM at the recipes' 128-token pages), DMA'd beside the page.
The pages are widened in VMEM and the scales folded into the products rather than into the pages:
a key's scale multiplies its score, q . (s k) = s (q . k), and a value's its softmax weight,
sum_t p_t (s_t v_t) = sum_t (p_t s_t) v_t, so no widened-and-scaled copy of a page is formed.

One program per (sequence, KV head), serving the head's whole GQA group. The page table and lengths
are scalar-prefetched into SMEM; the program walks its sequence's pages in blocks of
``block_pages``, DMAing block i + 1 while it computes block i (double-buffered), with an online
softmax across blocks. Only the pages below the sequence's length are read: a block's pages past
it are neither copied nor used (their buffer rows are masked, so stale VMEM cannot reach the sum).
Every program waits for its own copies, so both grid axes are parallel (megacore splits them).

It reads full-width pools too (no scale pools): the same walk without the scaling. The engine runs
JAX's kernel for those (``pallas_attention``); tests run both in interpret mode against
``attention.paged_decode_attention_reference``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASKED = -1e30  # finite: a masked score's exp is an exact 0 against any real score


def _dot(a, b, contract_b: int):
    return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def _kernel(lengths_ref, page_table_ref, q_ref, k_hbm, v_hbm, *refs, block_pages: int, pages_per_sequence: int,
            scaled: bool):
    if scaled:
        k_scale_hbm, v_scale_hbm, o_ref, k_buf, v_buf, k_scale_buf, v_scale_buf, sems = refs
    else:
        o_ref, k_buf, v_buf, sems = refs
    b, h = pl.program_id(0), pl.program_id(1)
    page_size = k_hbm.shape[2]
    block_tokens = block_pages * page_size
    length = lengths_ref[b]
    num_blocks = jax.lax.div(length + block_tokens - 1, block_tokens)  # lax: jnp's // lowers a sign op

    def block_copies(block, slot):
        """(whether page j of the block is below the length, its copies) for each page j."""
        pages = []
        for j in range(block_pages):
            position = block * block_pages + j
            page = page_table_ref[b * pages_per_sequence + jnp.minimum(position, pages_per_sequence - 1)]
            copies = [pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[slot, j], sems.at[slot]),
                      pltpu.make_async_copy(v_hbm.at[h, page], v_buf.at[slot, j], sems.at[slot])]
            if scaled:
                copies += [pltpu.make_async_copy(scale_hbm.at[h, pl.ds(page, 1)], scale_buf.at[slot, pl.ds(j, 1)],
                                                 sems.at[slot])
                           for scale_hbm, scale_buf in ((k_scale_hbm, k_scale_buf), (v_scale_hbm, v_scale_buf))]
            pages.append((position * page_size < length, copies))
        return pages

    def start(block, slot):
        for used, copies in block_copies(block, slot):
            @pl.when(used)
            def _():
                for copy in copies:
                    copy.start()

    def wait(block, slot):
        for used, copies in block_copies(block, slot):
            @pl.when(used)
            def _():
                for copy in copies:
                    copy.wait()

    start(0, 0)
    q = q_ref[...].astype(jnp.float32)  # [G, D]
    group, head_dim = q.shape

    def body(block, carry):
        running_max, total, acc = carry
        slot = jax.lax.rem(block, 2)

        @pl.when(block + 1 < num_blocks)
        def _():
            start(block + 1, 1 - slot)

        wait(block, slot)
        scores, weights_scale, values = [], [], []
        for j in range(block_pages):
            first = (block * block_pages + j) * page_size
            token = first + jax.lax.broadcasted_iota(jnp.int32, (1, page_size), 1)
            k = k_buf[slot, j].astype(jnp.float32)  # [S, D]
            s = _dot(q, k, 1)  # [G, S]
            if scaled:
                s = s * k_scale_buf[slot, pl.ds(j, 1), :]
            scores.append(jnp.where(token < length, s, _MASKED))
            row = first + jax.lax.broadcasted_iota(jnp.int32, (page_size, head_dim), 0)
            values.append(jnp.where(row < length, v_buf[slot, j].astype(jnp.float32), 0.0))
            weights_scale.append(v_scale_buf[slot, pl.ds(j, 1), :] if scaled else None)
        block_max = functools.reduce(jnp.maximum, [s.max(axis=1, keepdims=True) for s in scores])
        new_max = jnp.maximum(running_max, block_max)
        alpha = jnp.exp(running_max - new_max)
        total, acc = alpha * total, alpha * acc
        for j, s in enumerate(scores):
            p = jnp.exp(s - new_max)  # masked tokens: exactly 0
            total = total + p.sum(axis=1, keepdims=True)
            if scaled:  # a masked token's scale may be stale VMEM: select, never multiply, it away
                p = jnp.where(s > _MASKED, p * weights_scale[j], 0.0)
            acc = acc + _dot(p, values[j], 0)
        return new_max, total, acc

    init = (jnp.full((group, 1), -jnp.inf, jnp.float32), jnp.zeros((group, 1), jnp.float32),
            jnp.zeros((group, head_dim), jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, num_blocks, body, init)
    o_ref[...] = (acc / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_pages",))
def eight_bit_paged_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, k_scale_pool: jax.Array | None,
                              v_scale_pool: jax.Array | None, page_table: jax.Array, lengths: jax.Array, *,
                              block_pages: int) -> jax.Array:
    """q [B, Hq, D] (already scaled); pools [Hkv, num_pages, S, D]; scale pools [Hkv, num_pages, S]
    (or both None for full-width pools); page_table [B, P] int32, ``block_pages`` dividing P;
    lengths [B] int32 -> [B, Hq, D] in q's dtype. Run it under ``pltpu.force_tpu_interpret_mode()``
    to interpret it on CPU."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pool.shape
    pages_per_sequence = page_table.shape[1]
    group = num_heads // num_kv_heads
    scaled = k_scale_pool is not None
    grouped = q.reshape(batch, num_kv_heads, group, head_dim)
    q_spec = pl.BlockSpec((None, None, group, head_dim), lambda b, h, *_: (b, h, 0, 0))
    in_hbm = pl.BlockSpec(memory_space=pltpu.HBM)
    pages = lambda pool: pltpu.VMEM((2, block_pages, page_size, head_dim), pool.dtype)
    scratch = [pages(k_pool), pages(v_pool)]
    operands = [k_pool, v_pool]
    if scaled:
        scratch += [pltpu.VMEM((2, block_pages, page_size), jnp.float32)] * 2
        operands += [k_scale_pool.astype(jnp.float32), v_scale_pool.astype(jnp.float32)]
    # Held where they lie: XLA would otherwise copy an operand small enough (a scale pool) whole into
    # VMEM before each call, reading all of it instead of the running sequences' rows.
    operands = [grouped] + [pltpu.with_memory_space_constraint(x, pltpu.HBM) for x in operands]
    out = pl.pallas_call(
        functools.partial(_kernel, block_pages=block_pages, pages_per_sequence=pages_per_sequence, scaled=scaled),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(batch, num_kv_heads),
            in_specs=[q_spec] + [in_hbm] * (len(operands) - 1), out_specs=q_spec,
            scratch_shapes=[*scratch, pltpu.SemaphoreType.DMA((2,))]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        out_shape=jax.ShapeDtypeStruct(grouped.shape, q.dtype),
        name="eight_bit_paged_attention",
    )(lengths, page_table.reshape(-1), *operands)
    return out.reshape(batch, num_heads, head_dim)
