"""Sampling rules, per-sample keys and behavior log-probs."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from rlax_core.inference.sampling import (
    SamplingMode, _filter_mask, greedy_tokens, prompt_key_id, sample_key, sample_tokens, token_draws, token_logprobs)


def _draws(seeds, prompt=7, sample=0, token=0):
    n = len(seeds)
    as_i32 = lambda x: jnp.full((n,), x, jnp.int32)
    return token_draws(jnp.asarray(seeds, jnp.int32), as_i32(prompt), as_i32(sample), as_i32(token), 1)[:, 0]


def _draw(logits, seeds, temperature=1.0, top_k=0, top_p=1.0, mode=SamplingMode.FILTERED):
    n = len(seeds)
    return sample_tokens(jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, len(logits))), _draws(seeds),
                         jnp.full((n,), temperature), jnp.full((n,), top_k, jnp.int32), jnp.full((n,), top_p), mode)


def test_greedy_rows_take_the_argmax_in_every_mode():
    logits = [0.1, 3.0, 2.9, -1.0]
    for mode in SamplingMode:
        tokens, _ = _draw(logits, [1, 2, 3], temperature=0.0, mode=mode)
        assert np.asarray(tokens).tolist() == [1, 1, 1]


def test_logprobs_are_raw_log_softmax_whatever_the_sampling_settings():
    logits = jnp.asarray([[0.5, 2.0, -1.0, 1.0]] * 64)
    tokens, logprobs = _draw(logits[0], list(range(64)), temperature=0.3, top_k=2)
    expected = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(64), tokens]
    np.testing.assert_allclose(np.asarray(logprobs), np.asarray(expected), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(token_logprobs(logits, tokens)), np.asarray(expected), rtol=1e-6)


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = np.log(np.asarray([0.4, 0.3, 0.2, 0.1]))
    seeds = list(range(400))
    assert set(np.asarray(_draw(logits, seeds, top_k=2)[0]).tolist()) == {0, 1}
    # top_p 0.65: 0.4 < 0.65 so token 1 is needed; 0.7 >= 0.65 so token 2 is not.
    assert set(np.asarray(_draw(logits, seeds, top_p=0.65)[0]).tolist()) == {0, 1}
    assert set(np.asarray(_draw(logits, seeds, top_p=0.05)[0]).tolist()) == {0}
    assert set(np.asarray(_draw(logits, seeds, top_k=3, top_p=1.0)[0]).tolist()) == {0, 1, 2}


def test_temperature_sampling_follows_the_tempered_distribution():
    logits = np.log(np.asarray([0.5, 0.3, 0.2]))
    seeds = list(range(4000))
    counts = np.bincount(np.asarray(_draw(logits, seeds, mode=SamplingMode.TEMPERATURE)[0]), minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.2], atol=0.03)
    hot = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
    counts = np.bincount(np.asarray(_draw(logits, seeds, temperature=2.0)[0]), minlength=3) / 4000
    np.testing.assert_allclose(counts, hot, atol=0.03)


def test_a_decode_chunks_draws_are_its_tokens_keys_uniforms():
    """token_draws, computed for a whole chunk before its first step, gives each token the uniform
    of that token's own key: a chunk's length or start never changes a sample."""
    seeds, prompts, samples, first = (jnp.asarray(x, jnp.int32) for x in ([5, 5, 11], [9, 9, 2], [0, 3, 1], [0, 7, 30]))
    draws = np.asarray(token_draws(seeds, prompts, samples, first, 6))
    for row in range(3):
        for j in range(6):
            key = sample_key(seeds[row], prompts[row], samples[row], first[row] + j)
            assert draws[row, j] == float(jax.random.uniform(key))
    later = np.asarray(token_draws(seeds, prompts, samples, first + 2, 4))
    np.testing.assert_array_equal(later, draws[:, 2:])


def test_keys_depend_on_seed_prompt_sample_and_token_only():
    base = jax.random.key_data(sample_key(*map(jnp.int32, (5, 9, 2, 3))))
    again = jax.random.key_data(sample_key(*map(jnp.int32, (5, 9, 2, 3))))
    assert np.array_equal(base, again)
    for changed in [(6, 9, 2, 3), (5, 10, 2, 3), (5, 9, 3, 3), (5, 9, 2, 4)]:
        assert not np.array_equal(base, jax.random.key_data(sample_key(*map(jnp.int32, changed))))


def test_prompt_key_ids_are_stable_and_checked():
    assert prompt_key_id("gsm8k/17") == prompt_key_id("gsm8k/17") != prompt_key_id("gsm8k/18")
    assert prompt_key_id(12) == 12
    with pytest.raises(ValueError):
        prompt_key_id(-1)


def test_greedy_takes_the_first_of_tied_maxima_like_argmax():
    logits = jnp.asarray([[1.0, 5.0, 5.0, -2.0], [-3.0, -3.0, -4.0, -3.0], [0.0, 0.0, 0.0, 7.0]])
    assert np.asarray(greedy_tokens(logits)).tolist() == np.asarray(jnp.argmax(logits, -1)).tolist() == [1, 0, 3]


def test_filters_keep_what_a_sorted_vocabulary_keeps():
    """The bisection thresholds against the definition: sort, keep the top k and the smallest prefix reaching top_p."""
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=3.0, size=(48, 1000)).astype(np.float32)
    top_k = rng.choice([0, 1, 5, 50, 999], 48).astype(np.int32)
    top_p = rng.choice([1.0, 0.9, 0.5, 0.05], 48).astype(np.float32)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    keep = np.asarray(_filter_mask(jnp.asarray(logits), jnp.asarray(probs), jnp.asarray(top_k), jnp.asarray(top_p)))
    for row in range(48):
        order = np.argsort(-logits[row], kind="stable")
        mass_before = np.cumsum(probs[row][order]) - probs[row][order]
        allowed = (mass_before < top_p[row]) | (np.arange(1000) == 0) | (top_p[row] >= 1.0)
        if top_k[row]:
            allowed &= np.arange(1000) < top_k[row]
        expected = np.zeros(1000, bool)
        expected[order[allowed]] = True
        assert np.array_equal(keep[row], expected), (row, top_k[row], top_p[row])


def test_draws_from_a_large_vocabulary_follow_the_distribution():
    """The two-level inverse CDF over 3000 tokens (blocks of 64), zero-weight tokens never drawn."""
    rng = np.random.default_rng(4)
    logits = rng.normal(scale=2.0, size=3000).astype(np.float32)
    logits[rng.choice(3000, 1500, replace=False)] = -np.inf  # as a top-k/top-p mask leaves them
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    seeds = list(range(20000))
    tokens = np.asarray(_draw(logits, seeds, mode=SamplingMode.TEMPERATURE)[0])
    assert np.all(np.isfinite(logits[tokens]))
    counts = np.bincount(tokens, minlength=3000) / len(seeds)
    heavy = np.argsort(-probs)[:20]  # the twenty most probable tokens, each within four standard errors
    tolerance = 4 * np.sqrt(probs[heavy] / len(seeds)) + 1e-3
    assert np.all(np.abs(counts[heavy] - probs[heavy]) <= tolerance), (counts[heavy], probs[heavy])
    assert abs(counts[heavy].sum() - probs[heavy].sum()) < 0.02
