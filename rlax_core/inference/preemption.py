"""A preempted sequence's cache: how it leaves the pool and how it comes back (``EngineConfig.preemption``).

The engine preempts a running sequence when pages on demand run out (``engine._make_room``): its
pages go back to the pool and it waits at the head of the queue. When it is admitted again it holds
new pages, and they must hold what the old ones held:

* recompute: its prompt and tokens so far are computed again (``continuation.feed_uncached``).
  Nothing is kept meanwhile, but a recomputation adds in another order than the decode steps did,
  so its keys can differ in the last bits: eight-bit pages can round them to another step, and a
  sampled token whose draw lies within rounding of a boundary can part.
* swap: its pages (with their scale pages when eight-bit) are read to host memory when it is
  preempted and written back into its new pages when it resumes, bit for bit, so its later tokens
  and log-probs are those of a run without preemption. A read and a write of
  ``pages_per_sequence`` pages, the pages it does not fill padded with the sink page: one compiled
  shape each, compiled at warm-up. Host memory holds a preempted sequence's pages until it resumes.

A recomputing weight swap (``on_new_version: recompute``) always recomputes, the running sequences
and those swapped out alike: its point is keys of the new version.
"""

from __future__ import annotations

import functools
import jax
import numpy as np

from rlax_core.inference.config import EngineConfig
from rlax_core.inference.kv_cache import KVCache
from rlax_core.inference.pages import pages_needed
from rlax_core.inference.programs import pin_kv_sharding
from rlax_core.inference.sequences import SequenceState


@jax.jit
def read_pages(cache: KVCache, pages) -> KVCache:
    """Pages ``pages`` [P] of every layer's pools (scale pools too): [Hkv, P, S, D] (or [Hkv, P, S])."""
    return jax.tree.map(lambda pool: pool[:, pages], cache)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("cache",))
def write_pages_back(cache: KVCache, pages, saved: KVCache, *, mesh=None) -> KVCache:
    """Write ``read_pages``' output into pages ``pages`` [P] (the sink page takes the padding)."""
    write = lambda pool, held: pool.at[:, pages].set(held.astype(pool.dtype), mode="promise_in_bounds")
    return pin_kv_sharding(jax.tree.map(write, cache, saved), mesh)


def _page_list(config: EngineConfig, pages: list[int]) -> np.ndarray:
    padded = np.zeros(config.pages_per_sequence, np.int32)  # the sink page beyond its own
    padded[:len(pages)] = pages
    return padded


def _to_host(cache: KVCache, pages: np.ndarray) -> KVCache:
    return jax.tree.map(np.asarray, read_pages(cache, pages))


def leave(cache: KVCache, seq: SequenceState, config: EngineConfig, swap: bool) -> None:
    """Before ``seq``'s pages are released: keep host copies of the pages holding its cached tokens
    (all but its last, which the decode loop feeds) when ``swap``, else mark it for recomputation."""
    if swap:
        cached = seq.length - 1
        seq.swapped = _to_host(cache, _page_list(config, seq.pages[:pages_needed(cached, config.page_size)]))
        seq.cached = cached
    else:
        seq.swapped, seq.cached = None, 0


def restore(cache: KVCache, seq: SequenceState, config: EngineConfig, mesh=None) -> KVCache:
    """Write a swapped ``seq``'s host copies into the new pages it was admitted with; the cache.
    (A sequence left for recomputation is fed by ``continuation.feed_uncached``, from position 0.)"""
    held = seq.pages[:pages_needed(seq.cached, config.page_size)]
    cache = write_pages_back(cache, _page_list(config, held), seq.swapped, mesh=mesh)
    seq.swapped = None
    return cache


def forget(sequences) -> None:
    """Drop the host copies of these queued sequences: they resume by recomputation (new weights)."""
    for seq in sequences:
        if seq.swapped is not None:
            seq.swapped, seq.cached = None, 0


def warm_up(cache: KVCache, config: EngineConfig, mesh=None) -> KVCache:
    """Compile the swap's read and write (of the sink page only)."""
    sink = _page_list(config, [])
    return write_pages_back(cache, sink, _to_host(cache, sink), mesh=mesh)

