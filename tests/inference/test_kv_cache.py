"""The page allocator (free list, admission), page writes (sink page for invalid tokens), the decode window."""

import numpy as np
import jax.numpy as jnp
import pytest

from rlax_core.inference.kv_cache import (
    SINK_PAGE, KVCache, PageAllocator, gather_window, pages_needed, scatter_window, values_tokens_minor, write_pages)


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
    pool = jnp.zeros((2, 4, 2, 1))  # [Hkv, pages, page_size, D]
    new = jnp.arange(1, 13, dtype=jnp.float32).reshape(2, 3, 2, 1)  # [B, T, Hkv, D]
    page_table = jnp.asarray([[3, 1], [2, 0]], jnp.int32)
    positions = jnp.asarray([[0, 1, 2], [0, 1, 2]])
    valid = jnp.asarray([[True, True, True], [True, False, False]])
    written = np.asarray(write_pages(pool, new, page_table, positions, valid))[..., 0]
    assert written[0, 3].tolist() == [1, 3] and written[0, 1].tolist() == [5, 0]
    assert written[1, 3].tolist() == [2, 4] and written[1, 1].tolist() == [6, 0]  # the second KV head
    assert written[0, 2].tolist() == [7, 0] and written[1, 2].tolist() == [8, 0]


@pytest.mark.parametrize("head_dim", [3, 16])  # values tokens-minor, then tokens-major (values_tokens_minor)
def test_decode_window_holds_each_slot_in_order_and_writes_back_only_real_pages(head_dim):
    layers, num_pages, page_size, kv_heads = 2, 7, 2, 2
    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.normal(size=(layers, kv_heads, num_pages, page_size, head_dim)), jnp.float32)
    cache = KVCache(tuple(k), tuple(k + 100))
    page_table = jnp.asarray([[5, 2, 0], [0, 0, 0], [1, 3, 6]], jnp.int32)  # slot 1 idle; slot 0 has 2 pages
    window = gather_window(cache, page_table)
    # Keys are [B, Hkv, D, T]: token t of slot 2 is page 3's offset 0 when t == 2.
    np.testing.assert_array_equal(window.k[1][2, :, :, 2], k[1, :, 3, 0])
    value = window.v[0][0, :, :, 3] if values_tokens_minor(head_dim) else window.v[0][0, :, 3, :]
    np.testing.assert_array_equal(value, k[0, :, 2, 1] + 100)
    new = jnp.full((3, kv_heads, head_dim), -1.0)
    window = window.write(1, jnp.asarray([3, 4, 5]), new, new)  # every row writes, the idle slot 1 too
    written = scatter_window(cache, window, page_table)
    written_k, written_v = np.stack(written.k), np.stack(written.v)
    expected = np.asarray(k).copy()
    expected[1, :, 2, 1] = -1.0  # slot 0, token 3 = page 2 offset 1; slot 1's write lands in the sink
    expected[1, :, 6, 1] = -1.0  # slot 2, token 5 = its third page (6), offset 1
    real = [1, 2, 3, 5, 6]
    np.testing.assert_array_equal(written_k[:, :, real], expected[:, :, real])
    np.testing.assert_array_equal(written_v[0][:, real], expected[0][:, real] + 100)
    assert written_v[1, :, 2, 1].tolist() == [[-1.0] * head_dim] * kv_heads
    np.testing.assert_array_equal(written_k[:, :, 4], k[:, :, 4])  # in no page table: untouched


@pytest.mark.parametrize("head_dim", [3, 16])
def test_a_one_slot_window_write_changes_only_its_token(head_dim):
    # One slot takes DecodeWindow.write's dynamic-update-slice path; more slots take the scatter.
    rng = np.random.default_rng(1)
    k = jnp.asarray(rng.normal(size=(2, 2, 4, 2, head_dim)), jnp.float32)
    window = gather_window(KVCache(tuple(k), tuple(k + 100)), jnp.asarray([[3, 1]], jnp.int32))
    new_k, new_v = jnp.full((1, 2, head_dim), -1.0), jnp.full((1, 2, head_dim), -2.0)
    written = window.write(1, jnp.asarray([2]), new_k, new_v)
    keys, values = np.asarray(written.k[1]), np.asarray(written.v[1])
    values = values if values_tokens_minor(head_dim) else values.transpose(0, 1, 3, 2)  # now [B, Hkv, D, T]
    np.testing.assert_array_equal(keys[0, :, :, 2], new_k[0])
    np.testing.assert_array_equal(values[0, :, :, 2], new_v[0])
    untouched = [0, 1, 3]
    np.testing.assert_array_equal(keys[..., untouched], np.asarray(window.k[1])[..., untouched])
    old_values = np.asarray(window.v[1])
    old_values = old_values if values_tokens_minor(head_dim) else old_values.transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(values[..., untouched], old_values[..., untouched])
    np.testing.assert_array_equal(written.k[0], window.k[0])  # other layers untouched
