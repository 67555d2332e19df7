"""JAX's Pallas paged decode kernels (TPU and GPU, interpreted on CPU) against the jnp reference, and
the reference against dense attention."""

import numpy as np
import jax.numpy as jnp
import pytest

from rlax_core.inference.attention import paged_decode_attention_reference, prefill_attention, window_decode_attention
from rlax_core.inference.kv_cache import gather_pages, to_window_layout, write_pages
from rlax_core.inference.pallas_attention import gpu_splits, paged_decode_attention, tpu_block_pages


def paged_problem(seed, batch, num_heads, num_kv_heads, head_dim, page_size, pages_per_seq, lengths):
    rng = np.random.default_rng(seed)
    num_pages = batch * pages_per_seq + 1
    q = rng.normal(size=(batch, num_heads, head_dim)).astype(np.float32)
    k = rng.normal(size=(num_kv_heads, num_pages, page_size, head_dim)).astype(np.float32)
    v = rng.normal(size=(num_kv_heads, num_pages, page_size, head_dim)).astype(np.float32)
    # Pages scattered through the pool in random order, as after many admissions and frees.
    page_table = rng.permutation(np.arange(1, num_pages)).reshape(batch, pages_per_seq).astype(np.int32)
    return q, k, v, page_table, np.asarray(lengths, np.int32)


def _dense_attention(q, k, v, page_table, lengths, scale):
    """Row by row in numpy: gather the sequence's tokens in order, softmax over the visible ones."""
    batch, num_heads, _ = q.shape
    num_kv_heads, _, page_size, head_dim = k.shape
    group = num_heads // num_kv_heads
    out = np.zeros_like(q)
    for b in range(batch):
        keys = k[:, page_table[b]].reshape(num_kv_heads, -1, head_dim)[:, : lengths[b]]
        values = v[:, page_table[b]].reshape(num_kv_heads, -1, head_dim)[:, : lengths[b]]
        for h in range(num_heads):
            if lengths[b] == 0:
                continue
            scores = keys[h // group] @ q[b, h] * scale
            weights = np.exp(scores - scores.max())
            out[b, h] = (weights / weights.sum()) @ values[h // group]
    return out


def _to_bfloat16_and_back(x):
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize("kernel", ["gpu", "tpu"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [
    (8, 2), pytest.param(4, 4, marks=pytest.mark.slow), pytest.param(6, 1, marks=pytest.mark.slow)])
def test_jax_pallas_kernels_match_the_reference_on_ragged_lengths_and_gqa(kernel, num_heads, num_kv_heads):
    page_size, pages_per_seq = 4, 6
    lengths = [1, 3, 4, 5, 24, 11, 17]  # one token, partial page, exact page, full table, ragged rest
    q, k, v, page_table, lengths = paged_problem(0, len(lengths), num_heads, num_kv_heads, 16, page_size,
                                                  pages_per_seq, lengths)
    if kernel == "tpu":  # the TPU kernel casts loaded K and V to bfloat16 (pallas_attention): compare on those
        k, v = _to_bfloat16_and_back(k), _to_bfloat16_and_back(v)
    problem = (q, k, v, page_table, lengths)
    scale = 16 ** -0.5
    reference = paged_decode_attention_reference(*map(jnp.asarray, problem), scale=scale)
    out = paged_decode_attention(*map(jnp.asarray, problem), scale=scale, kernel=kernel, interpret=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(reference), _dense_attention(*problem, scale), atol=2e-6, rtol=1e-5)


def test_the_tpu_kernel_rounds_a_float32_cache_to_bfloat16():
    # Why the TPU recipes keep a bfloat16 cache: on float32 pages the kernel is bfloat16-accurate only.
    q, k, v, page_table, lengths = paged_problem(5, 3, 8, 2, 16, 4, 4, [5, 9, 16])
    out = paged_decode_attention(*map(jnp.asarray, (q, k, v, page_table, lengths)), scale=0.25, kernel="tpu",
                                 interpret=True)
    exact = _dense_attention(q, k, v, page_table, lengths, 0.25)
    rounded = _dense_attention(q, _to_bfloat16_and_back(k), _to_bfloat16_and_back(v), page_table, lengths, 0.25)
    assert np.abs(np.asarray(out) - exact).max() > 1e-4
    np.testing.assert_allclose(np.asarray(out), rounded, atol=2e-5, rtol=1e-5)


def test_the_reference_gives_an_empty_sequence_zeros():
    problem = paged_problem(0, 3, 8, 2, 16, 4, 2, [0, 3, 8])
    reference = paged_decode_attention_reference(*map(jnp.asarray, problem), scale=0.25)
    assert not np.asarray(reference)[0].any() and np.asarray(reference)[1:].any()


def test_kernel_block_sizes_divide_the_page_table_as_the_kernels_require():
    assert tpu_block_pages(48, 64) == 8 and tpu_block_pages(7, 16) == 7 and tpu_block_pages(5, 1024) == 1
    assert gpu_splits(64) == (16, 4) and gpu_splits(6) == (6, 1) and gpu_splits(7) == (7, 1)
    with pytest.raises(ValueError, match="unknown paged-attention kernel"):
        paged_decode_attention(*(jnp.zeros(1),) * 5, scale=1.0, kernel="cuda")


@pytest.mark.parametrize("head_dim", [8, 64])  # the window's values tokens-minor, then tokens-major
def test_window_attention_matches_numpy_in_both_value_layouts(head_dim):
    lengths = [1, 3, 4, 5, 20, 0, 11]
    problem = paged_problem(2, len(lengths), 8, 2, head_dim, 4, 5, lengths)
    reference = paged_decode_attention_reference(*map(jnp.asarray, problem), scale=head_dim ** -0.5)
    np.testing.assert_allclose(np.asarray(reference), _dense_attention(*problem, head_dim ** -0.5), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [8, 64])
def test_window_attention_to_a_token_not_yet_written_equals_attention_after_writing_it(head_dim):
    # The decode loop attends to the window plus the new token, then writes the token (programs).
    lengths = np.asarray([0, 3, 4, 19, 11], np.int32)  # 0: the new token is all there is to see
    q, k, v, page_table, _ = paged_problem(3, len(lengths), 8, 2, head_dim, 4, 5, lengths)
    own_k, own_v = (np.random.default_rng(4).normal(size=(len(lengths), 2, head_dim)).astype(np.float32)
                    for _ in range(2))
    pages, offsets = page_table[np.arange(len(lengths)), lengths // 4], lengths % 4
    k_written, v_written = k.copy(), v.copy()
    k_written[:, pages, offsets], v_written[:, pages, offsets] = own_k.transpose(1, 0, 2), own_v.transpose(1, 0, 2)
    scale = head_dim ** -0.5
    expected = _dense_attention(q, k_written, v_written, page_table, lengths + 1, scale)
    keys, values = to_window_layout(gather_pages(jnp.asarray(k), jnp.asarray(page_table)),
                                    gather_pages(jnp.asarray(v), jnp.asarray(page_table)))
    out = window_decode_attention(jnp.asarray(q), keys, values, jnp.asarray(lengths), scale,
                                  current=(jnp.asarray(own_k), jnp.asarray(own_v)))
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["gpu", "tpu"])
def test_paged_attention_ignores_tokens_past_length(kernel):
    q, k, v, page_table, lengths = paged_problem(1, 3, 4, 2, 16, 4, 3, [2, 6, 9])
    attend = lambda k, v: paged_decode_attention(*map(jnp.asarray, (q, k, v, page_table, lengths)), scale=0.3,
                                                 kernel=kernel, interpret=True)
    before = attend(k, v)
    # Overwrite every cached slot at or past each sequence's length with garbage.
    k2, v2 = k.copy(), v.copy()
    for b, length in enumerate(lengths):
        for position in range(length, page_table.shape[1] * 4):
            page, offset = page_table[b, position // 4], position % 4
            k2[:, page, offset], v2[:, page, offset] = 1e3, -1e3
    np.testing.assert_array_equal(np.asarray(before), np.asarray(attend(k2, v2)))


def test_prefill_attention_rows_equal_paged_decode_of_the_same_tokens():
    rng = np.random.default_rng(2)
    batch, length, num_heads, num_kv_heads, head_dim, page_size = 2, 7, 4, 2, 8, 4
    q = rng.normal(size=(batch, length, num_heads, head_dim)).astype(np.float32)
    k = rng.normal(size=(batch, length, num_kv_heads, head_dim)).astype(np.float32)
    v = rng.normal(size=(batch, length, num_kv_heads, head_dim)).astype(np.float32)
    dense = prefill_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.ones((batch, length), bool), 0.5)

    page_table = jnp.asarray([[1, 2], [4, 3]], jnp.int32)
    pool = jnp.zeros((num_kv_heads, 5, page_size, head_dim))  # [head, page, slot, dim]
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    valid = jnp.ones((batch, length), bool)
    k_pool = write_pages(pool, jnp.asarray(k), page_table, positions, valid)
    v_pool = write_pages(pool, jnp.asarray(v), page_table, positions, valid)
    for t in range(length):
        decoded = paged_decode_attention_reference(
            jnp.asarray(q[:, t]), k_pool, v_pool, page_table, jnp.full((batch,), t + 1), scale=0.5)
        np.testing.assert_allclose(np.asarray(decoded), np.asarray(dense[:, t]), atol=2e-6)


def test_prefill_attention_ignores_left_padding():
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 6, 4, 8)).astype(np.float32) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    unpadded = prefill_attention(*map(jnp.asarray, (q[:, 2:], k[:, 2:], v[:, 2:])), jnp.ones((1, 4), bool), 0.4)
    garbage_k, garbage_v = k.copy(), v.copy()
    garbage_k[:, :2], garbage_v[:, :2] = 50.0, -50.0
    padded = prefill_attention(*map(jnp.asarray, (q, garbage_k, garbage_v)), jnp.asarray([[0, 0, 1, 1, 1, 1]], bool), 0.4)
    np.testing.assert_allclose(np.asarray(padded)[:, 2:], np.asarray(unpadded), atol=2e-6)
