"""Our TPU paged-attention kernel for eight-bit pages (``inference.pallas_eight_bit``), run in TPU
interpret mode on CPU against the jnp reference on the same pages: int8, fp8 and bfloat16 pools, GQA,
sequences of many lengths over several page blocks, and pages past a sequence's length never read."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from rlax_core.inference.attention import paged_decode_attention_reference
from rlax_core.inference.kv_cache import quantize_tokens
from rlax_core.inference.pallas_eight_bit import eight_bit_paged_attention
from tests.inference.test_attention import paged_problem

# one token, a partial page, an exact page, a partial and an exact block of 2 pages, the full table
LENGTHS = [1, 3, 4, 6, 8, 11, 24]
STORED = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}


def _pools(dtype, k, v):
    if dtype == "bfloat16":
        return jnp.asarray(k, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16), (None, None)
    (qk, sk), (qv, sv) = (quantize_tokens(jnp.asarray(x), STORED[dtype]) for x in (k, v))
    return qk, qv, (sk, sv)


def _kernel(q, k, v, scales, page_table, lengths, block_pages=2):
    with pltpu.force_tpu_interpret_mode():
        return eight_bit_paged_attention(q, k, v, *scales, page_table, lengths, block_pages=block_pages)


@pytest.mark.parametrize("dtype", ["int8", "fp8", "bfloat16"])
def test_the_kernel_matches_the_reference_on_the_same_pages(dtype):
    """The reference folds the same scales into its float32 products; the kernel widens each page to
    float32 in VMEM, so the two agree to float32 rounding (1e-5), whatever the page dtype."""
    q, k, v, page_table, lengths = paged_problem(0, len(LENGTHS), 8, 2, 16, 4, 6, LENGTHS)  # GQA: 4 per KV head
    k, v, scales = _pools(dtype, k, v)
    q, page_table, lengths = jnp.asarray(q * 0.25), jnp.asarray(page_table), jnp.asarray(lengths)
    expected = paged_decode_attention_reference(q, k, v, page_table, lengths, 1.0, *scales)
    out = _kernel(q, k, v, scales, page_table, lengths)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_pages_past_a_sequences_length_are_never_read():
    """Every page-table entry past a sequence's length points at a page of NaN keys, values and scales:
    the kernel neither copies it nor lets what its buffers held before reach the sum."""
    lengths = [1, 5, 9, 2]
    q, k, v, page_table, lengths = paged_problem(1, len(lengths), 4, 1, 16, 4, 4, lengths)
    k, v, (sk, sv) = _pools("int8", k, v)
    sk, sv = sk.at[:, 0].set(jnp.nan), sv.at[:, 0].set(jnp.nan)  # page 0: nobody's
    used = np.arange(page_table.shape[1])[None, :] * 4 < lengths[:, None]
    poisoned = np.where(used, page_table, 0).astype(np.int32)
    q, lengths = jnp.asarray(q * 0.25), jnp.asarray(lengths)
    expected = paged_decode_attention_reference(q, k, v, jnp.asarray(page_table), lengths, 1.0, sk, sv)
    out = _kernel(q, k, v, (sk, sv), jnp.asarray(poisoned), lengths)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-5, rtol=1e-5)
