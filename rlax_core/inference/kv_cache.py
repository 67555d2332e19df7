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

SINK_PAGE = 0


class KVCache(NamedTuple):
    """Key and value pools: per layer one array ``[num_kv_heads, num_pages, page_size, head_dim]``."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def page_size(self) -> int:
        return self.k[0].shape[2]


def kv_pool_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) pool."""
    return (num_kv_heads, num_pages, page_size, head_dim)


def init_kv_cache(num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                  dtype=jnp.float32) -> KVCache:
    shape = kv_pool_shape(num_pages, page_size, num_kv_heads, head_dim)
    return KVCache(tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))


def write_pages(pool: jax.Array, new: jax.Array, page_table: jax.Array, positions: jax.Array,
                valid: jax.Array) -> jax.Array:
    """Scatter ``new`` [B, T, Hkv, D] into one layer's ``pool`` at each token's position.

    ``positions`` [B, T] are token positions within each sequence; tokens where ``valid`` [B, T] is
    false go to the sink page.
    """
    page_size = pool.shape[2]
    page_index = jnp.clip(positions // page_size, 0, page_table.shape[1] - 1)
    pages = jnp.where(valid, jnp.take_along_axis(page_table, page_index, axis=1), SINK_PAGE)
    offsets = jnp.where(valid, positions % page_size, 0)
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


def gather_pages(pool: jax.Array, page_table: jax.Array) -> jax.Array:
    """Each sequence's cached tokens in order, heads-major: [Hkv, B, P*S, D] from one layer's pool.

    Page ids come from the allocator, so they are in bounds and the gather needs no clamping.
    """
    gathered = pool.at[:, page_table].get(mode="promise_in_bounds")  # [Hkv, B, P, S, D]
    return gathered.reshape(pool.shape[0], page_table.shape[0], -1, pool.shape[-1])


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
    """Per layer, the running slots' keys [B, Hkv, D, T] and values (layout: ``to_window_layout``)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    def write(self, layer: int, positions: jax.Array, k: jax.Array, v: jax.Array) -> "DecodeWindow":
        """Store one token per slot, k/v [B, Hkv, D], at ``positions`` [B], each inside the window.

        Every row writes, unguarded, so that the buffers are updated in place: XLA:CPU copied them
        for a guarded write (a masked or dropped one, or a one-row scatter, which it rewrites into a
        bounds-checked read-modify-write): four copies of each buffer per step at batch 1.
        """
        minor = values_tokens_minor(v.shape[-1])
        k, v = k.astype(self.k[layer].dtype), v.astype(self.v[layer].dtype)
        if positions.shape[0] == 1:
            zero, at = jnp.int32(0), positions[0].astype(jnp.int32)
            keys = jax.lax.dynamic_update_slice(self.k[layer], k[..., None], (zero, zero, zero, at))
            values = (jax.lax.dynamic_update_slice(self.v[layer], v[..., None], (zero, zero, zero, at)) if minor
                      else jax.lax.dynamic_update_slice(self.v[layer], v[:, :, None], (zero, zero, at, zero)))
        else:
            rows, put = jnp.arange(positions.shape[0]), {"mode": "promise_in_bounds", "unique_indices": True}
            keys = self.k[layer].at[rows, :, :, positions].set(k, **put)
            values = (self.v[layer].at[rows, :, :, positions] if minor else self.v[layer].at[rows, :, positions])
            values = values.set(v, **put)
        return DecodeWindow(_replace(self.k, layer, keys), _replace(self.v, layer, values))


def _replace(items: tuple, index: int, item) -> tuple:
    return (*items[:index], item, *items[index + 1:])


def gather_window(cache: KVCache, page_table: jax.Array) -> DecodeWindow:
    layers = [to_window_layout(gather_pages(k, page_table), gather_pages(v, page_table)) for k, v in zip(*cache)]
    return DecodeWindow(tuple(k for k, _ in layers), tuple(v for _, v in layers))


def scatter_window(cache: KVCache, window: DecodeWindow, page_table: jax.Array) -> KVCache:
    """Write the window back into its pages. Rows of idle slots (page table 0) land in the sink."""
    batch, pages_per_sequence = page_table.shape
    page_size, head_dim = cache.k[0].shape[2:]

    def put(pool, heads_major):  # [B, Hkv, T, D] -> pool [Hkv, pages, S, D]
        pages = heads_major.reshape(batch, pool.shape[0], pages_per_sequence, page_size, head_dim)
        return pool.at[:, page_table].set(pages.transpose(1, 0, 2, 3, 4).astype(pool.dtype), mode="promise_in_bounds")

    minor = values_tokens_minor(head_dim)
    k_pools = tuple(put(pool, keys.transpose(0, 1, 3, 2)) for pool, keys in zip(cache.k, window.k))
    v_pools = tuple(put(pool, values.transpose(0, 1, 3, 2) if minor else values)
                    for pool, values in zip(cache.v, window.v))
    return KVCache(k_pools, v_pools)
