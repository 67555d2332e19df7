"""The page allocator (free list, admission) and pool (which sequence holds which pages), page writes
(sink page for invalid tokens), the decode window."""

import numpy as np
import jax.numpy as jnp
import pytest

from rlax_core.inference.config import SamplingParams
from rlax_core.inference.kv_cache import (
    SINK_PAGE, KVCache, gather_window, scatter_window, values_tokens_minor, write_pages)
from rlax_core.inference.pages import PageAllocator, PagePool, pages_needed
from rlax_core.inference.sequences import Request, SequenceState


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


def test_the_pool_gives_a_sequence_its_whole_budget_and_takes_every_page_back():
    pool = PagePool(num_pages=9, page_size=4, admission="reserve")  # 8 usable pages
    request = Request([1, 2, 3], SamplingParams(max_new_tokens=10))  # 13 tokens: 4 pages
    first, second, third = (SequenceState(order, request, order) for order in range(3))
    assert pool.admit(first, 3) and pool.admit(second, 3) and len(first.pages) == 4
    assert not set(first.pages) & set(second.pages) and SINK_PAGE not in first.pages + second.pages
    assert not pool.admit(third, 3) and third.pages == [] and pool.num_free == 0  # nothing taken
    pool.release(first)
    assert first.pages == [] and pool.num_free == 4 and pool.admit(third, 3)
    episode = SequenceState(3, Request([1, 2, 3], SamplingParams(max_new_tokens=2), episode_tokens=16), 0)
    pool.release(second)
    assert pool.admit(episode, 3) and len(episode.pages) == 4  # an episode's whole budget, not its first turn


def test_pages_on_demand_grow_and_shared_pages_come_back_with_their_last_holder():
    pool = PagePool(num_pages=9, page_size=4, admission="on_demand", lookahead=4)
    request = Request(list(range(1, 10)), SamplingParams(max_new_tokens=20))  # 9 prompt tokens, 29 in all
    owner, sibling, late = (SequenceState(order, request, order) for order in range(3))
    assert pool.admit(owner, 9) and len(owner.pages) == 4  # 9 tokens + 4 of look-ahead: 4 pages, not 8
    pool.share(owner, sibling, 2)  # the two full pages of its 8 cached prompt tokens
    assert pool.admit(sibling, 9, running=1) and sibling.pages[:2] == owner.pages[:2] and len(sibling.pages) == 4
    assert [pool.references(p) for p in owner.pages] == [2, 2, 1, 1] and pool.in_use == 6 == pool.peak_in_use
    assert not pool.admit(late, 9, running=2)  # 4 pages wanted, 2 free, 2 kept for the running ones to grow
    assert pool.grow(owner, 20) and len(owner.pages) == 5 and not pool.grow(owner, 29)  # nothing taken
    assert len(owner.pages) == 5 and pool.num_free == 1
    pool.release(owner)
    assert pool.num_free == 4 and pool.references(sibling.pages[0]) == 1  # the shared pages stay with the sibling
    pool.release(sibling)
    assert pool.num_free == 8 and pool.in_use == 0
    with pytest.raises(RuntimeError, match="already holds pages"):
        pool.admit(late, 9)
        pool.share(late, late, 1)


def test_pages_needed_rounds_up():
    assert [pages_needed(n, 4) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]


@pytest.mark.parametrize("per_token", [True, False])  # a K or V pool of vectors, a scale pool of numbers
def test_write_pages_puts_tokens_at_page_offsets_and_invalid_ones_in_the_sink(per_token):
    pool = jnp.zeros((2, 4, 2, 1))  # [Hkv, pages, page_size, D]
    new = jnp.arange(1, 13, dtype=jnp.float32).reshape(2, 3, 2, 1)  # [B, T, Hkv, D]
    page_table = jnp.asarray([[3, 1], [2, 0]], jnp.int32)
    positions = jnp.asarray([[0, 1, 2], [0, 1, 2]])
    valid = jnp.asarray([[True, True, True], [True, False, False]])
    if per_token:
        written = np.asarray(write_pages(pool, new, page_table, positions, valid))[..., 0]
    else:  # [Hkv, pages, page_size] and [B, T, Hkv]: each head's numbers in its own rows
        written = np.asarray(write_pages(pool[..., 0], new[..., 0], page_table, positions, valid))
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
