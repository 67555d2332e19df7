"""The paged KV cache: fixed-size pages on the device and a page table per slot (the host's side of
the pages, which sequence holds which, is ``pages``).

A sequence's keys and values live in ``ceil(len / page_size)`` pages anywhere in one shared pool;
row ``s`` of the page table lists slot ``s``'s pages in order, so token ``p`` of that sequence sits
at ``(page_table[s, p // page_size], p % page_size)``. Memory follows each request's own length
budget (prompt + its max_new_tokens) instead of the engine-wide maximum.

Page 0 is never handed out: it is the sink for writes that must go nowhere (prompt padding, idle
slots), which keeps every write a fixed-shape scatter with no branch.

The pools are per layer and KV-heads-major, ``[num_kv_heads, num_pages, page_size, head_dim]``:
the layout JAX's paged-attention kernels (TPU and GPU) read in place, and the one a tensor-parallel
engine shards over its devices by KV head (each device holds its heads' pages of every page).
Per-layer arrays, not one stacked pool, because a kernel's operand must be a whole array: a layer
sliced out of a stacked pool is a copy of it per layer per step.

Eight-bit pages (``engine.cache_dtype`` int8 or fp8) hold each token's key (value) per KV head as
eight-bit numbers with one float32 scale, absmax / the format's largest value
(``lora.EIGHT_BIT_FORMATS``), in scale pools ``[num_kv_heads, num_pages, page_size]`` (pages
rounded up to a multiple of 8: ``scale_pool_shape``) beside the pools: a page's scales are per head and per token slot, written with the token. A scale per whole
page would have to be known before the page's later tokens exist (decode fills a page a token at a
time), and rescaling a page as it fills would rewrite the tokens already there. The attention paths
fold the scales into their products (a key's scale multiplies its score, a value's its weight): the
CPU window, the reference, JAX's GPU kernel and our TPU kernel (``pallas_eight_bit``), which DMAs a
page's row of scales beside the page.

A ``DecodeWindow`` is the running sequences' pages laid out densely, per layer a keys array
``[slots, kv_heads, head_dim, tokens]`` and a values array whose layout follows the head dim
(``to_window_layout``). Backends without a paged-attention kernel (CPU)
gather it once per decode call, decode the call's steps against it and write it back: one gather
per call instead of one per layer per token. The pool stays the cache of record, so memory
between calls still follows real lengths.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.models.lora import EIGHT_BIT_FORMATS
from rlax_core.utils.dtypes import dtype as dtype_named

SINK_PAGE = 0
_SCALE_PAGE_ROWS = 8  # the sublanes of a float32 tile on TPU (scale_pool_shape)


class KVCache(NamedTuple):
    """Key and value pools: per layer one array ``[num_kv_heads, num_pages, page_size, head_dim]``;
    eight-bit pools add per layer a scale pool ``[num_kv_heads, num_pages, page_size]`` each (else
    the scale tuples are empty)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    k_scale: tuple[jax.Array, ...] = ()
    v_scale: tuple[jax.Array, ...] = ()

    @property
    def page_size(self) -> int:
        return self.k[0].shape[2]

    @property
    def quantized(self) -> bool:
        return bool(self.k_scale)

    def layer(self, index: int) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
        """One layer's (keys, values, key scales, value scales); no scales for full-width pools."""
        if not self.quantized:
            return self.k[index], self.v[index], None, None
        return self.k[index], self.v[index], self.k_scale[index], self.v_scale[index]


_LARGEST = {np.dtype(stored): largest for stored, largest in EIGHT_BIT_FORMATS.values()}


def eight_bit_dtype(cache_dtype: str) -> np.dtype | None:
    """The stored dtype of an eight-bit cache dtype name ("int8", "fp8"); None for a float one."""
    return np.dtype(EIGHT_BIT_FORMATS[cache_dtype][0]) if cache_dtype in EIGHT_BIT_FORMATS else None


def quantize_tokens(x: jax.Array, stored) -> tuple[jax.Array, jax.Array]:
    """x [..., D] as eight-bit ``stored`` numbers with a float32 scale per vector (absmax over D /
    the format's largest value): x ~= q * scale[..., None], to half an int8 step of the vector's range."""
    largest = _LARGEST[np.dtype(stored)]
    x32 = x.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(x32), axis=-1), 1e-30) / largest
    quantized = jnp.clip(x32 / scale[..., None], -largest, largest)
    if jnp.issubdtype(stored, jnp.integer):
        quantized = jnp.round(quantized)
    return quantized.astype(stored), scale


def dequantize_tokens(q: jax.Array, scale: jax.Array, dtype=jnp.float32) -> jax.Array:
    """The vectors a :func:`quantize_tokens` pair stands for."""
    return (q.astype(jnp.float32) * scale[..., None]).astype(dtype)


def kv_pool_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) pool."""
    return (num_kv_heads, num_pages, page_size, head_dim)


def init_kv_cache(num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                  dtype="float32") -> KVCache:
    """Zeroed pools of ``dtype`` (a name or a float dtype; "int8" / "fp8" add the scale pools)."""
    shape = kv_pool_shape(num_pages, page_size, num_kv_heads, head_dim)
    eight_bit = eight_bit_dtype(dtype) if isinstance(dtype, str) else None
    stored = dtype_named(dtype) if eight_bit is None else eight_bit
    pools = lambda shape, stored: tuple(jnp.zeros(shape, stored) for _ in range(num_layers))
    if eight_bit is None:
        return KVCache(pools(shape, stored), pools(shape, stored))
    scales = scale_pool_shape(num_pages, page_size, num_kv_heads)
    return KVCache(pools(shape, stored), pools(shape, stored), pools(scales, jnp.float32), pools(scales, jnp.float32))


def scale_pool_shape(num_pages: int, page_size: int, num_kv_heads: int) -> tuple[int, int, int]:
    """One layer's key (or value) scale pool ``[num_kv_heads, pages, page_size]``, its page axis
    rounded up to a multiple of 8 (rows past ``num_pages`` are never used): TPU holds a float32
    array in (8, 128) tiles, and with a page count that is not a multiple of 8 its default layout
    turns the pool pages-outermost, heads-second to save the padding, which the eight-bit kernel
    (``pallas_eight_bit``, one row per page and head) then had copied back, every layer and step."""
    return (num_kv_heads, -(-num_pages // _SCALE_PAGE_ROWS) * _SCALE_PAGE_ROWS, page_size)


def write_layer(cache: KVCache, layer: int, k: jax.Array, v: jax.Array, page_table: jax.Array,
                positions: jax.Array, valid: jax.Array) -> KVCache:
    """``cache`` with new keys and values [B, T, Hkv, D] written into layer ``layer``'s pages at
    their positions (:func:`write_pages`), quantized with their scales for eight-bit pools."""
    write = lambda pool, new: write_pages(pool, new, page_table, positions, valid)
    if not cache.quantized:
        return cache._replace(k=_replace(cache.k, layer, write(cache.k[layer], k)),
                              v=_replace(cache.v, layer, write(cache.v[layer], v)))
    (qk, sk), (qv, sv) = (quantize_tokens(x, cache.k[0].dtype) for x in (k, v))
    return KVCache(_replace(cache.k, layer, write(cache.k[layer], qk)), _replace(cache.v, layer, write(cache.v[layer], qv)),
                   _replace(cache.k_scale, layer, write(cache.k_scale[layer], sk)),
                   _replace(cache.v_scale, layer, write(cache.v_scale[layer], sv)))


def write_pages(pool: jax.Array, new: jax.Array, page_table: jax.Array, positions: jax.Array,
                valid: jax.Array) -> jax.Array:
    """Scatter ``new`` [B, T, Hkv, D] into one layer's ``pool`` at each token's position (or a scale
    pool's ``new`` [B, T, Hkv] into ``[Hkv, num_pages, page_size]``).

    ``positions`` [B, T] are token positions within each sequence; tokens where ``valid`` [B, T] is
    false go to the sink page.
    """
    page_size = pool.shape[2]
    page_index = jnp.clip(positions // page_size, 0, page_table.shape[1] - 1)
    pages = jnp.where(valid, jnp.take_along_axis(page_table, page_index, axis=1), SINK_PAGE)
    offsets = jnp.where(valid, positions % page_size, 0)
    if pool.ndim == 3:
        return _write_scales(pool, new, pages, offsets)
    heads = pool.shape[0]
    # One head's row per update, the heads a batch dimension of the scatter (not part of each update):
    # the pool keeps the layout the paged-attention kernel reads, and a pool sharded by heads is
    # written where it lies. With the heads inside each update (``pool.at[:, pages, offsets]``),
    # XLA:TPU carried the pool heads-inner for the scatter and copied every layer's whole pool back
    # for the kernel at every decode step, once a chip held 2 KV heads or more.
    index = jnp.broadcast_to(jnp.stack([pages, offsets], axis=-1), (heads, *pages.shape, 2))
    numbers = jax.lax.ScatterDimensionNumbers(update_window_dims=(3,), inserted_window_dims=(1, 2),
                                              scatter_dims_to_operand_dims=(1, 2), operand_batching_dims=(0,),
                                              scatter_indices_batching_dims=(0,))
    return jax.lax.scatter(pool, index, new.transpose(2, 0, 1, 3).astype(pool.dtype), numbers,
                           indices_are_sorted=False, unique_indices=False, mode="promise_in_bounds")


def _write_scales(pool: jax.Array, new: jax.Array, pages: jax.Array, offsets: jax.Array) -> jax.Array:
    """A scale pool [Hkv, pages, page_size] with one number per token and head written: as rows of the
    pool seen as [Hkv * pages, page_size] (a free reshape: its page axis is a multiple of 8), each head's
    row ``head * pages + page``. With the heads a batching dimension of a scalar scatter, XLA:TPU counted
    each layer's write as 3.5 whole scale pools once a chip held 2 KV heads (7 GB a QwQ-32B step on v5p)."""
    heads, num_pages, page_size = pool.shape
    rows = (jnp.arange(heads)[:, None, None] * num_pages + pages[None]).reshape(-1)
    columns = jnp.broadcast_to(offsets[None], (heads, *offsets.shape)).reshape(-1)
    flat = pool.reshape(heads * num_pages, page_size)
    flat = flat.at[rows, columns].set(new.transpose(2, 0, 1).reshape(-1).astype(pool.dtype), mode="promise_in_bounds")
    return flat.reshape(pool.shape)


def gather_pages(pool: jax.Array, page_table: jax.Array) -> jax.Array:
    """Each sequence's cached tokens in order, heads-major: [Hkv, B, P*S, D] from one layer's pool
    ([Hkv, B, P*S] from a scale pool).

    Page ids come from the allocator, so they are in bounds and the gather needs no clamping.
    """
    gathered = pool.at[:, page_table].get(mode="promise_in_bounds")  # [Hkv, B, P, S, D]
    return gathered.reshape(pool.shape[0], page_table.shape[0], -1, *pool.shape[3:])


def values_tokens_minor(head_dim: int) -> bool:
    """Whether the window holds values [B, Hkv, D, T] (tokens minor) rather than [B, Hkv, T, D].

    The value product contracts over T. Measured on XLA:CPU (batch 32-64, 160 tokens): with
    head_dim 8 the tokens-minor layout is 2x faster (a dot along contiguous T per output), with 32
    and 64 it is 3x slower (the library's matrix kernel wants D contiguous); 16 is even.
    """
    return head_dim < 16


def to_window_layout(k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gathered k/v [Hkv, B, T, D] (:func:`gather_pages`) to the window layout: keys [B, Hkv, D, T],
    values [B, Hkv, D, T] for a small head_dim and [B, Hkv, T, D] otherwise (:func:`values_tokens_minor`).

    Decode attention contracts keys over D: tokens-minor keys make the score product stream over T
    (the tokens-major layout made it a short horizontal sum, four times slower).
    """
    values = v.transpose(1, 0, 3, 2) if values_tokens_minor(v.shape[-1]) else v.transpose(1, 0, 2, 3)
    return k.transpose(1, 0, 3, 2), values


class DecodeWindow(NamedTuple):
    """Per layer, the running slots' keys [B, Hkv, D, T] and values (layout: ``to_window_layout``);
    from eight-bit pools, their scales [B, Hkv, T] too (else empty)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    k_scale: tuple[jax.Array, ...] = ()
    v_scale: tuple[jax.Array, ...] = ()

    def layer(self, index: int) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
        if not self.k_scale:
            return self.k[index], self.v[index], None, None
        return self.k[index], self.v[index], self.k_scale[index], self.v_scale[index]

    def write(self, layer: int, positions: jax.Array, k: jax.Array, v: jax.Array) -> "DecodeWindow":
        """Store one token per slot, k/v [B, Hkv, D], at ``positions`` [B], each inside the window
        (quantized, its scales beside it, in an eight-bit window).

        Every row writes, unguarded, so that the buffers are updated in place: XLA:CPU copied them
        for a guarded write (a masked or dropped one, or a one-row scatter, which it rewrites into a
        bounds-checked read-modify-write): four copies of each buffer per step at batch 1.
        """
        minor = values_tokens_minor(v.shape[-1])
        scales = ()
        if self.k_scale:
            (k, k_scale), (v, v_scale) = (quantize_tokens(x, self.k[layer].dtype) for x in (k, v))
            scales = (_put_tokens(self.k_scale[layer], positions, k_scale, 2),
                      _put_tokens(self.v_scale[layer], positions, v_scale, 2))
        k, v = k.astype(self.k[layer].dtype), v.astype(self.v[layer].dtype)
        keys = _put_tokens(self.k[layer], positions, k, 3)
        values = _put_tokens(self.v[layer], positions, v, 3 if minor else 2)
        window = DecodeWindow(_replace(self.k, layer, keys), _replace(self.v, layer, values), self.k_scale, self.v_scale)
        if scales:
            window = window._replace(k_scale=_replace(self.k_scale, layer, scales[0]),
                                     v_scale=_replace(self.v_scale, layer, scales[1]))
        return window


def _put_tokens(buffer: jax.Array, positions: jax.Array, new: jax.Array, token_axis: int) -> jax.Array:
    """``buffer`` [B, ...] with row b's ``new[b]`` (``buffer`` less its token axis) at ``positions[b]``
    along ``token_axis``."""
    if positions.shape[0] == 1:
        start = [jnp.int32(0)] * buffer.ndim
        start[token_axis] = positions[0].astype(jnp.int32)
        return jax.lax.dynamic_update_slice(buffer, jnp.expand_dims(new, token_axis), tuple(start))
    index: list = [jnp.arange(positions.shape[0])] + [slice(None)] * (buffer.ndim - 1)
    index[token_axis] = positions
    return buffer.at[tuple(index)].set(new, mode="promise_in_bounds", unique_indices=True)


def _replace(items: tuple, index: int, item) -> tuple:
    return (*items[:index], item, *items[index + 1:])


def gather_window(cache: KVCache, page_table: jax.Array) -> DecodeWindow:
    layers = [to_window_layout(gather_pages(k, page_table), gather_pages(v, page_table)) for k, v in zip(cache.k, cache.v)]
    window = DecodeWindow(tuple(k for k, _ in layers), tuple(v for _, v in layers))
    if not cache.quantized:
        return window
    scales = lambda pools: tuple(gather_pages(pool, page_table).transpose(1, 0, 2) for pool in pools)  # [B, Hkv, T]
    return window._replace(k_scale=scales(cache.k_scale), v_scale=scales(cache.v_scale))


def scatter_window(cache: KVCache, window: DecodeWindow, page_table: jax.Array) -> KVCache:
    """Write the window back into its pages. Rows of idle slots (page table 0) land in the sink."""
    batch, pages_per_sequence = page_table.shape
    page_size, head_dim = cache.k[0].shape[2:]

    def put(pool, heads_major):  # [B, Hkv, T, D] -> pool [Hkv, pages, S, D]; scales [B, Hkv, T] -> [Hkv, pages, S]
        pages = heads_major.reshape(batch, pool.shape[0], pages_per_sequence, page_size, *pool.shape[3:])
        pages = jnp.moveaxis(pages, 1, 0)
        return pool.at[:, page_table].set(pages.astype(pool.dtype), mode="promise_in_bounds")

    minor = values_tokens_minor(head_dim)
    k_pools = tuple(put(pool, keys.transpose(0, 1, 3, 2)) for pool, keys in zip(cache.k, window.k))
    v_pools = tuple(put(pool, values.transpose(0, 1, 3, 2) if minor else values)
                    for pool, values in zip(cache.v, window.v))
    return KVCache(k_pools, v_pools, tuple(map(put, cache.k_scale, window.k_scale)),
                   tuple(map(put, cache.v_scale, window.v_scale)))
