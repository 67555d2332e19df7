"""Paged decode attention on accelerators, from JAX's own Pallas kernels.

    out = paged_decode_attention(q, k_pool, v_pool, page_table, lengths, scale, kernel="tpu")

Both kernels read one layer's pools ``[Hkv, num_pages, page_size, D]`` (``kv_cache``'s layout) in
place through the page table, visit only the pages below each sequence's length, and serve a KV
head's whole GQA group per program:

- ``"tpu"``: ``jax.experimental.pallas.ops.tpu.paged_attention`` (Mosaic). It DMAs
  ``pages_per_compute_block`` pages at a time into VMEM, double-buffered. It casts the loaded K and
  V to bfloat16 before its products (``MultiPageAsyncCopyDescriptor._maybe_dequantize`` in its
  source), so with a float32 cache it computes on bfloat16-rounded keys and values: the TPU recipes
  keep a bfloat16 cache, where that cast loses nothing.
- ``"gpu"``: ``jax.experimental.pallas.ops.gpu.paged_attention`` (Triton). It splits each sequence's
  pages into ``k_splits`` partitions reduced by a final flash-style combine, in float32.

``ragged_paged_attention`` (TPU) serves batches that mix prefill and decode tokens against a pool
holding K and V interleaved per head; the engine prefills and decodes in separate programs over
separate K and V pools, so the decode kernel is the one that fits it.

``interpret=True`` runs a kernel on CPU: the GPU kernel through the generic Pallas interpreter, the
TPU kernel through TPU interpret mode (``pltpu.force_tpu_interpret_mode``), which simulates its
VMEM, DMAs and semaphores. Tests check both against
:func:`rlax_core.inference.attention.paged_decode_attention_reference` that way.

Neither kernel takes a softmax scale: the query is scaled before the call.

Eight-bit pages (``engine.cache_dtype`` int8 or fp8) come with their scale pools ``[Hkv, num_pages,
S]`` (``kv_cache``): the GPU kernel takes them as they are (``k_scales_pages``: it scales each
score by its key's scale and each weight by its value's, after widening the page in the kernel);
on TPU our own kernel (``pallas_eight_bit``) reads them the same way, a scale row per page DMA'd
beside it. JAX's TPU kernel would take them as a ``QuantizedTensor`` whose wrapper broadcasts the
scales to ``[Hkv, num_pages, S, D]`` before the call: a float32 array four times the int8 pool per
layer and step, 7.19x the bfloat16 step's bytes for the QwQ-32B decode on v5p (docs/compile.md).
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.gpu import paged_attention as gpu_paged_attention
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu_paged_attention

from rlax_core.inference.pallas_eight_bit import eight_bit_paged_attention

KERNELS = ("tpu", "gpu")
_TPU_BLOCK_TOKENS = 512  # tokens per DMA'd compute block: large enough to hide the copy, small for VMEM
_GPU_MAX_SPLITS = 16  # the GPU kernel's default k_splits
_GPU_BLOCK_PAGES = 8  # the GPU kernel's default pages_per_compute_block
_GPU_BLOCK_HEADS = 16  # query heads per program (the kernel pads a smaller GQA group up to it)


def kernel_for_backend(platform: str) -> str:
    """The kernel a backend runs: its own on TPU and GPU; the CPU interprets the GPU one (tests)."""
    return "tpu" if platform == "tpu" else "gpu"


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def tpu_block_pages(pages_per_sequence: int, page_size: int) -> int:
    """Pages per compute block: the kernel needs a divisor of the page-table width."""
    return _largest_divisor(pages_per_sequence, max(1, _TPU_BLOCK_TOKENS // page_size))


def gpu_splits(pages_per_sequence: int) -> tuple[int, int]:
    """(k_splits, pages_per_compute_block), both dividing what they split, as the kernel asserts."""
    splits = _largest_divisor(pages_per_sequence, _GPU_MAX_SPLITS)
    return splits, _largest_divisor(pages_per_sequence // splits, _GPU_BLOCK_PAGES)


def paged_decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, page_table: jax.Array,
                           lengths: jax.Array, scale: float, k_scale_pool: jax.Array | None = None,
                           v_scale_pool: jax.Array | None = None, *, kernel: str, interpret: bool = False) -> jax.Array:
    """q [B, Hq, D]; pools [Hkv, num_pages, S, D]; page_table [B, P]; lengths [B] -> [B, Hq, D].
    Eight-bit pools come with their scale pools [Hkv, num_pages, S].

    A sequence's ``lengths[b]`` must be at least 1 (the engine always attends to the new token).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown paged-attention kernel {kernel!r}; expected one of {KERNELS}")
    page_table, lengths = page_table.astype(jnp.int32), lengths.astype(jnp.int32)
    scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
    pages_per_sequence, page_size = page_table.shape[1], k_pool.shape[2]
    if kernel == "tpu":
        mode = pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()
        block_pages = tpu_block_pages(pages_per_sequence, page_size)
        with mode:
            if k_scale_pool is not None:
                return eight_bit_paged_attention(scaled, k_pool, v_pool, k_scale_pool, v_scale_pool, page_table,
                                                 lengths, block_pages=block_pages)
            return tpu_paged_attention(scaled, k_pool, v_pool, lengths, page_table,
                                       pages_per_compute_block=block_pages)
    splits, block_pages = gpu_splits(pages_per_sequence)
    return gpu_paged_attention.paged_attention(scaled, k_pool, v_pool, page_table, lengths, k_scale_pool, v_scale_pool,
                                               block_h=_GPU_BLOCK_HEADS,
                                               pages_per_compute_block=block_pages, k_splits=splits,
                                               interpret=interpret)
