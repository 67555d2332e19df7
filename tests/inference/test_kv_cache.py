"""The page allocator (free list, admission) and page writes (sink page for invalid tokens)."""

import numpy as np
import jax.numpy as jnp
import pytest

from rlax_core.inference.kv_cache import SINK_PAGE, PageAllocator, pages_needed, write_pages


def test_allocator_never_hands_out_the_sink_page_and_refuses_when_short():
    allocator = PageAllocator(6)
    first = allocator.allocate(3)
    second = allocator.allocate(2)
    assert SINK_PAGE not in first + second and len(set(first + second)) == 5
    assert allocator.allocate(1) is None and allocator.num_free == 0
    allocator.free(first)
    assert allocator.num_free == 3
    assert sorted(allocator.allocate(3)) == sorted(first)


def test_allocator_rejects_bad_frees():
    allocator = PageAllocator(4)
    with pytest.raises(ValueError, match="outside"):
        allocator.free([SINK_PAGE])
    pages = allocator.allocate(1)
    allocator.free(pages)
    with pytest.raises(RuntimeError, match="freed twice"):
        allocator.free(pages)


def test_pages_needed_rounds_up():
    assert [pages_needed(n, 4) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]


def test_write_pages_puts_tokens_at_page_offsets_and_invalid_ones_in_the_sink():
    pool = jnp.zeros((1, 4, 2, 1, 1))
    new = jnp.arange(1, 7, dtype=jnp.float32).reshape(2, 3, 1, 1)
    page_table = jnp.asarray([[3, 1], [2, 0]], jnp.int32)
    positions = jnp.asarray([[0, 1, 2], [0, 1, 2]])
    valid = jnp.asarray([[True, True, True], [True, False, False]])
    written = np.asarray(write_pages(pool, 0, new, page_table, positions, valid))[0, :, :, 0, 0]
    assert written[3].tolist() == [1, 2] and written[1].tolist() == [3, 0]
    assert written[2].tolist() == [4, 0]
