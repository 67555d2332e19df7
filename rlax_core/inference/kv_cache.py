"""The paged KV cache: fixed-size pages on the device, a page table per slot, a free list on the host.

A sequence's keys and values live in ``ceil(len / page_size)`` pages anywhere in one shared pool;
row ``s`` of the page table lists slot ``s``'s pages in order, so token ``p`` of that sequence sits
at ``(page_table[s, p // page_size], p % page_size)``. Memory follows each request's own length
budget (prompt + its max_new_tokens) instead of the engine-wide maximum.

Page 0 is never handed out: it is the sink for writes that must go nowhere (prompt padding, idle
slots), which keeps every write a fixed-shape scatter with no branch. Admission control reserves a
request's worst-case pages before it starts, so a running sequence never runs out of pages.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

SINK_PAGE = 0


class KVCache(NamedTuple):
    """Key and value pools, each ``[num_layers, num_pages, page_size, num_kv_heads, head_dim]``."""

    k: jax.Array
    v: jax.Array

    @property
    def page_size(self) -> int:
        return self.k.shape[2]


def init_kv_cache(num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                  dtype=jnp.float32) -> KVCache:
    shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def write_pages(pool: jax.Array, layer: int | jax.Array, new: jax.Array, page_table: jax.Array,
                positions: jax.Array, valid: jax.Array) -> jax.Array:
    """Scatter ``new`` [B, T, Hkv, D] into ``pool`` (one layer of it) at each token's position.

    ``positions`` [B, T] are token positions within each sequence; tokens where ``valid`` [B, T] is
    false go to the sink page.
    """
    page_size = pool.shape[2]
    page_index = jnp.clip(positions // page_size, 0, page_table.shape[1] - 1)
    pages = jnp.where(valid, jnp.take_along_axis(page_table, page_index, axis=1), SINK_PAGE)
    offsets = jnp.where(valid, positions % page_size, 0)
    return pool.at[layer, pages, offsets].set(new.astype(pool.dtype), mode="promise_in_bounds")


class PageAllocator:
    """Host-side free list of pages 1..num_pages-1 (page 0 is the sink)."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError("a paged cache needs the sink page plus at least one page")
        self.num_pages = num_pages
        # Hand out low page numbers first: a fresh engine then touches a compact prefix of the pool.
        self._free = list(range(num_pages - 1, SINK_PAGE, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` pages, or None (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        return [self._free.pop() for _ in range(count)]

    def free(self, pages: list[int]) -> None:
        if any(p == SINK_PAGE or not 0 < p < self.num_pages for p in pages):
            raise ValueError(f"cannot free pages {pages}: outside 1..{self.num_pages - 1}")
        self._free.extend(reversed(pages))
        if len(self._free) > self.num_pages - 1:
            raise RuntimeError("page freed twice: the free list holds more pages than the pool")


def pages_needed(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)
