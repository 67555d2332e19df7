"""Property tests (hypothesis): reward-shift invariance, documented token weights, masked tokens inert.

Shapes are fixed per test so each jitted function compiles once; hypothesis varies the values.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rlax_core import rl

NUM_GROUPS, GROUP_SIZE, T = 3, 4, 5
B = NUM_GROUPS * GROUP_SIZE
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

# Multiples of 0.5 keep sums exact in float32, so the only rounding is the final division.
halves = st.integers(-8, 8).map(lambda k: k * 0.5)
masks = arrays(np.float32, (B, T), elements=st.sampled_from([0.0, 1.0]))
finite = st.floats(-3, 3, width=32)


@SETTINGS
@given(
    rewards=arrays(np.float32, (NUM_GROUPS, GROUP_SIZE), elements=halves),
    shifts=arrays(np.float32, (NUM_GROUPS, 1), elements=st.integers(-20, 20).map(lambda k: k * 0.5)),
    estimator=st.sampled_from(["grpo", "dr_grpo", "rloo"]),
)
def test_adding_a_constant_to_a_group_changes_no_advantage(rewards, shifts, estimator):
    config = rl.AlgorithmConfig(advantage_estimator=estimator)
    mask = jnp.ones((B, T))
    before = rl.compute_advantages(config, jnp.asarray(rewards), mask)
    after = rl.compute_advantages(config, jnp.asarray(rewards + shifts), mask)
    np.testing.assert_allclose(after, before, atol=1e-4)


def documented_weights(mask, mode, max_length):
    """The token weights exactly as the aggregation docstring states them, computed in plain Python."""
    lengths = mask.sum(axis=1)
    total, sequences = mask.sum(), int((lengths > 0).sum())
    weights = np.zeros_like(mask, dtype=np.float64)
    for i, t in zip(*np.nonzero(mask)):
        if mode == "token_mean":
            weights[i, t] = 1 / total
        elif mode == "seq_mean_token_mean":
            weights[i, t] = 1 / (sequences * lengths[i])
        else:
            weights[i, t] = 1 / (sequences * max_length)
    return weights


@SETTINGS
@given(mask=masks, mode=st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_sum_norm"]))
def test_each_aggregation_mode_weighs_tokens_as_documented(mask, mode):
    expected = documented_weights(mask, mode, max_length=T)
    weights = np.asarray(rl.token_weights(jnp.asarray(mask), mode, T))
    np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-7)
    # aggregate() is the weighted sum: the derivative of the loss with respect to token (i, t) is its weight.
    grad = jax.grad(lambda x: rl.aggregate(x, jnp.asarray(mask), mode, T))(jnp.zeros((B, T)))
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
    if mask.any() and mode != "seq_sum_norm":
        assert np.isclose(weights.sum(), 1.0, atol=1e-5)


# Four configurations that between them switch on every term of the objective (each compiles once).
LOSS_CONFIGS = [
    rl.get_preset("grpo", entropy_coef=0.01, mismatch_correction="tis", mismatch_high=5.0),
    rl.get_preset("gspo", kl_coef=0.1, kl_estimator="k2", mismatch_correction="mis", mismatch_level="sequence", mismatch_low=0.1, mismatch_high=5.0),
    rl.get_preset("cispo", kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01),
    rl.get_preset("dr_grpo", dual_clip_c=3.0, mismatch_correction="mis", mismatch_low=0.1, mismatch_high=5.0),
]


@SETTINGS
@given(
    mask=masks,
    values=arrays(np.float32, (6, B, T), elements=finite),
    garbage=arrays(np.float32, (6, B, T), elements=st.one_of(st.floats(-50, 50, width=32), st.just(np.inf), st.just(-np.inf))),
    config=st.sampled_from(LOSS_CONFIGS),
)
def test_masked_tokens_never_contribute(mask, values, garbage, config):
    # Everything at masked positions is replaced by garbage (even inf): loss, gradient and metrics must not move.
    logprobs, old_shift, ref, behavior_shift, advantages, entropy = values
    inputs = np.stack([logprobs - 1.0, logprobs - 1.0 - 0.1 * old_shift, ref - 1.0, logprobs - 1.0 - 0.1 * behavior_shift, advantages, np.abs(entropy)])
    scrambled = np.where(mask[None] > 0, inputs, garbage)
    (clean_loss, clean_metrics), clean_grad = loss_and_grad(config, jnp.asarray(inputs), jnp.asarray(mask))
    (dirty_loss, dirty_metrics), dirty_grad = loss_and_grad(config, jnp.asarray(scrambled), jnp.asarray(mask))
    np.testing.assert_allclose(dirty_loss, clean_loss, rtol=1e-5, atol=1e-6)
    for key in clean_metrics:
        np.testing.assert_allclose(dirty_metrics[key], clean_metrics[key], rtol=1e-5, atol=1e-6, err_msg=key)
    dirty_grad = np.asarray(dirty_grad)
    assert np.all(np.isfinite(dirty_grad)) and np.all(dirty_grad[mask == 0] == 0.0)
    np.testing.assert_allclose(dirty_grad, clean_grad, rtol=1e-5, atol=1e-6)


@functools.partial(jax.jit, static_argnums=0)
def loss_and_grad(config, arrays, mask):
    """Loss, metrics and d loss / d logprobs for stacked (logprobs, old, ref, behaviour, advantages, entropy)."""

    def loss(logprobs):
        _, old, ref, behavior, advantages, entropy = arrays
        return rl.policy_loss(config, logprobs, old, advantages, mask, ref_logprobs=ref, behavior_logprobs=behavior, entropy=entropy)

    return jax.value_and_grad(loss, has_aux=True)(arrays[0])


@SETTINGS
@given(
    rewards=arrays(np.float32, (B,), elements=halves),
    mask=masks,
    garbage_values=arrays(np.float32, (B, T), elements=st.one_of(st.floats(-50, 50, width=32), st.just(np.inf))),
    estimator=st.sampled_from(sorted(rl.ADVANTAGE_ESTIMATORS.keys() & {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"})),
)
def test_masked_tokens_never_reach_advantages(rewards, mask, garbage_values, estimator):
    config = rl.AlgorithmConfig(advantage_estimator=estimator, kl_coef=0.1, kl_in_reward=True)
    group_ids = jnp.repeat(jnp.arange(NUM_GROUPS), GROUP_SIZE)
    values = np.where(mask > 0, 0.3, garbage_values)
    kl = np.where(mask > 0, 0.2, garbage_values)
    clean = rl.compute_advantages(config, rewards, mask, group_ids=group_ids, values=np.where(mask > 0, 0.3, 0.0), kl=np.where(mask > 0, 0.2, 0.0))
    dirty = rl.compute_advantages(config, rewards, mask, group_ids=group_ids, values=values, kl=kl)
    np.testing.assert_allclose(dirty, clean, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(dirty)[mask == 0] == 0.0)
