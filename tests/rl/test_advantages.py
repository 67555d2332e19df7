"""Advantage estimators on tiny inputs whose expected values are worked out by hand below."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core import rl
from rlax_core.config import ConfigError
from rlax_core.rl.advantages import gae

EPS = 1e-6


def config(estimator, **fields):
    return rl.AlgorithmConfig(advantage_estimator=estimator, std_eps=EPS, **fields)


def per_sequence(advantages):
    """The advantage of each row (all its tokens carry the same one), checking they agree."""
    advantages = np.asarray(advantages)
    np.testing.assert_allclose(advantages, advantages[:, :1] * (advantages != 0) + 0 * advantages, atol=1e-6)
    return advantages[:, 0]


def test_grpo_standardises_within_each_group_with_bessel_std():
    # group 0: [1, 0, 2], mean 1, sample std sqrt((0 + 1 + 1) / 2) = 1 -> [0, -1, 1]
    # group 1: [5, 5, 5], all equal -> exactly 0 (no signal)
    rewards = jnp.array([[1.0, 0.0, 2.0], [5.0, 5.0, 5.0]])
    advantages = rl.compute_advantages(config("grpo"), rewards, jnp.ones((6, 2)))
    np.testing.assert_allclose(per_sequence(advantages), [0, -1 / (1 + EPS), 1 / (1 + EPS), 0, 0, 0], atol=1e-6)
    assert np.all(np.asarray(advantages)[3:] == 0.0)


def test_group_ids_layout_matches_the_grouped_layout_in_any_order():
    # The same two groups as above, interleaved and with arbitrary ids.
    rewards = jnp.array([1.0, 5.0, 0.0, 5.0, 2.0, 5.0])
    group_ids = jnp.array([7, 3, 7, 3, 7, 3])
    advantages = rl.compute_advantages(config("grpo"), rewards, jnp.ones((6, 2)), group_ids=group_ids)
    np.testing.assert_allclose(per_sequence(advantages), [0, 0, -1, 0, 1, 0], atol=1e-5)


def test_dr_grpo_subtracts_the_group_mean_only():
    # [3, 0, 0, 1]: mean 1 -> [2, -1, -1, 0]
    advantages = rl.compute_advantages(config("dr_grpo"), jnp.array([[3.0, 0.0, 0.0, 1.0]]), jnp.ones((4, 3)))
    np.testing.assert_allclose(per_sequence(advantages), [2, -1, -1, 0], atol=1e-6)


def test_rloo_uses_the_mean_of_the_other_samples():
    # [3, 0, 0, 1]: 3 - (0+0+1)/3 = 8/3; 0 - (3+0+1)/3 = -4/3 (twice); 1 - (3+0+0)/3 = 0
    advantages = rl.compute_advantages(config("rloo"), jnp.array([[3.0, 0.0, 0.0, 1.0]]), jnp.ones((4, 3)))
    np.testing.assert_allclose(per_sequence(advantages), [8 / 3, -4 / 3, -4 / 3, 0], atol=1e-6)


def test_a_lone_sample_gets_no_advantage_from_group_estimators():
    for name in ("grpo", "dr_grpo", "rloo"):
        advantages = rl.compute_advantages(config(name), jnp.array([[3.0], [1.0]]), jnp.ones((2, 2)))
        assert np.all(np.asarray(advantages) == 0.0), name


def test_padding_tokens_and_padding_rows_get_zero_and_do_not_enter_group_statistics():
    # Row 2 is padding (mask all 0); its reward 100 must not move the group mean of [1, 0, 2, x].
    rewards = jnp.array([1.0, 0.0, 100.0, 2.0])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], jnp.float32)
    advantages = np.asarray(rl.compute_advantages(config("dr_grpo"), rewards, mask, group_ids=jnp.zeros(4, jnp.int32)))
    np.testing.assert_allclose(advantages, [[0, 0, 0], [-1, 0, 0], [0, 0, 0], [1, 1, 1]], atol=1e-6)
    # sample_mask does the same for a row that has tokens.
    advantages = rl.compute_advantages(
        config("dr_grpo"), rewards, jnp.ones((4, 3)), group_ids=jnp.zeros(4, jnp.int32), sample_mask=jnp.array([1, 1, 0, 1])
    )
    np.testing.assert_allclose(per_sequence(advantages), [0, -1, 0, 1], atol=1e-6)


def test_reinforce_pp_whitens_token_returns_over_the_batch():
    # rewards [1, 0]; row 0 has 2 tokens, row 1 one. Returns-to-go: [[1, 1], [0]].
    # Over the 3 tokens: mean 2/3, std sqrt((2 (1/3)^2 + (2/3)^2) / 3) = sqrt(2) / 3.
    mask = jnp.array([[1, 1, 0], [1, 0, 0]], jnp.float32)
    advantages = rl.compute_advantages(config("reinforce_pp"), jnp.array([1.0, 0.0]), mask)
    std = np.sqrt(2) / 3
    expected = [[(1 / 3) / (std + EPS)] * 2 + [0], [(-2 / 3) / (std + EPS), 0, 0]]
    np.testing.assert_allclose(advantages, expected, atol=1e-5)


def test_reinforce_pp_puts_the_kl_penalty_into_token_rewards():
    # kl_coef 0.5, kl row 0 [0.2, 0.4], row 1 [1.0] (9 = masked garbage).
    # Token rewards: row 0 [-0.1, -0.2 + 1] , row 1 [-0.5 + 0]; returns-to-go [0.7, 0.8], [-0.5].
    mask = jnp.array([[1, 1, 0], [1, 0, 0]], jnp.float32)
    kl = jnp.array([[0.2, 0.4, 9.0], [1.0, 9.0, 9.0]])
    cfg = config("reinforce_pp", kl_coef=0.5, kl_estimator="k1", kl_in_reward=True)
    advantages = np.asarray(rl.compute_advantages(cfg, jnp.array([1.0, 0.0]), mask, kl=kl))
    returns = np.array([0.7, 0.8, -0.5])
    whitened = (returns - returns.mean()) / (returns.std() + EPS)
    np.testing.assert_allclose(advantages, [[whitened[0], whitened[1], 0], [whitened[2], 0, 0]], atol=1e-5)


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    # group [1, 0]: centred [0.5, -0.5]; returns [[.5, .5], [-.5, -.5]]; batch mean 0, std 0.5.
    advantages = rl.compute_advantages(config("reinforce_pp_baseline"), jnp.array([[1.0, 0.0]]), jnp.ones((2, 2)))
    np.testing.assert_allclose(advantages, [[1, 1], [-1, -1]], atol=1e-5)


def test_gae_by_hand():
    # Reward 1 on the last of 3 tokens; V = [0.5, 0.6, 0.7]; gamma 0.9, lambda 0.5 (gamma*lambda 0.45).
    # t=2: delta = 1 - 0.7 = 0.3                       A2 = 0.3
    # t=1: delta = 0.9 * 0.7 - 0.6 = 0.03              A1 = 0.03 + 0.45 * 0.3 = 0.165
    # t=0: delta = 0.9 * 0.6 - 0.5 = 0.04              A0 = 0.04 + 0.45 * 0.165 = 0.11425
    mask = jnp.array([[1, 1, 1, 0]], jnp.float32)
    values = jnp.array([[0.5, 0.6, 0.7, 9.0]])
    cfg = config("gae", gamma=0.9, gae_lambda=0.5)
    advantages = rl.compute_advantages(cfg, jnp.array([1.0]), mask, values=values)
    np.testing.assert_allclose(advantages, [[0.11425, 0.165, 0.3, 0]], atol=1e-6)
    returns = rl.value_targets(cfg, jnp.array([1.0]), mask, values)
    np.testing.assert_allclose(returns, [[0.61425, 0.765, 1.0, 0]], atol=1e-6)


def test_gae_skips_masked_tokens_inside_a_row():
    # A masked token in the middle (e.g. a tool output) is skipped: same as the row without it.
    with_hole, _ = gae(jnp.array([[0.0, 5.0, 0.0, 1.0]]), jnp.array([[0.5, 9.0, 0.6, 0.7]]), jnp.array([[1.0, 0, 1, 1]]), 0.9, 0.5)
    without, _ = gae(jnp.array([[0.0, 0.0, 1.0]]), jnp.array([[0.5, 0.6, 0.7]]), jnp.array([[1.0, 1, 1]]), 0.9, 0.5)
    np.testing.assert_allclose(np.asarray(with_hole)[0, [0, 2, 3]], without[0], atol=1e-6)
    assert with_hole[0, 1] == 0.0


def test_gae_whitening_gives_zero_mean_unit_std_over_tokens():
    mask = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)
    values = jnp.array([[0.1, 0.4, 0.2], [0.3, 0.0, 0.0]])
    advantages = rl.compute_advantages(config("gae", whiten_advantages=True), jnp.array([1.0, -1.0]), mask, values=values)
    valid = np.asarray(advantages)[np.asarray(mask) > 0]
    np.testing.assert_allclose([valid.mean(), valid.std()], [0, 1], atol=1e-4)


def test_kl_in_reward_lowers_group_rewards_by_the_summed_penalty():
    # Dr. GRPO on shaped rewards: r - 0.5 * sum(kl) = [1 - 0.5*2, 1 - 0.5*0] = [0, 1]; mean 0.5.
    cfg = config("dr_grpo", kl_coef=0.5, kl_in_reward=True)
    kl = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    advantages = rl.compute_advantages(cfg, jnp.array([[1.0, 1.0]]), jnp.ones((2, 2)), kl=kl)
    np.testing.assert_allclose(per_sequence(advantages), [-0.5, 0.5], atol=1e-6)


def test_gfpo_keeps_the_k_shortest_and_standardises_over_them():
    # lengths [4, 1, 3, 2], keep 2 -> samples 1 and 3; their rewards [0, 1]: mean 0.5, std sqrt(0.5).
    mask = jnp.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
    cfg = config("grpo", group_filter="length", group_filter_keep=2)
    advantages = rl.compute_advantages(cfg, jnp.array([[1.0, 0.0, 1.0, 1.0]]), mask)
    a = 0.5 / (np.sqrt(0.5) + EPS)
    np.testing.assert_allclose(np.asarray(advantages)[:, 0], [0, -a, 0, a], atol=1e-5)
    assert np.all(np.asarray(advantages)[[0, 2]] == 0)


def test_gfpo_by_reward_per_token():
    # rewards [1, 0, 2, 1] / lengths [4, 1, 3, 2] = [.25, 0, .67, .5] -> keep samples 2 and 3, rewards [2, 1].
    mask = jnp.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
    cfg = config("grpo", group_filter="reward_per_token", group_filter_keep=2)
    advantages = rl.compute_advantages(cfg, jnp.array([[1.0, 0.0, 2.0, 1.0]]), mask)
    a = 0.5 / (np.sqrt(0.5) + EPS)
    np.testing.assert_allclose(np.asarray(advantages)[:, 0], [0, 0, a, -a], atol=1e-5)


def test_gfpo_token_mean_is_over_the_retained_completions_tokens():
    # lengths [4, 1, 3, 2], keep the 2 shortest: GFPO's loss is sum_{i in S} sum_t l / sum_{i in S} |o_i| = /3.
    mask = jnp.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
    cfg = config("grpo", group_filter="length", group_filter_keep=2)
    trained = rl.trained_mask(cfg, jnp.array([[1.0, 0.0, 1.0, 1.0]]), mask)
    assert np.asarray(trained).tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
    per_token = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)
    np.testing.assert_allclose(float(rl.aggregate(per_token, trained, "token_mean")), (4 + 12 + 13) / 3, rtol=1e-6)
    unfiltered = config("grpo")
    assert np.array_equal(np.asarray(rl.trained_mask(unfiltered, jnp.ones((1, 4)), mask)), np.asarray(mask))


def test_gfpo_ties_go_to_the_earlier_sample():
    keep = rl.group_filter_mask("length", 1, jnp.zeros(3), jnp.array([2, 2, 2]), jnp.zeros(3, jnp.int32), jnp.ones(3, bool))
    assert np.asarray(keep).tolist() == [True, False, False]


def test_compute_advantages_is_jittable_with_static_config():
    cfg = rl.get_preset("grpo")
    jitted = jax.jit(rl.compute_advantages, static_argnums=0)
    rewards, mask = jnp.array([[1.0, 0.0, 2.0]]), jnp.ones((3, 2))
    np.testing.assert_allclose(jitted(cfg, rewards, mask), rl.compute_advantages(cfg, rewards, mask), atol=1e-6)


def test_missing_inputs_fail_clearly():
    with pytest.raises(ValueError, match="needs groups"):
        rl.compute_advantages(config("grpo"), jnp.ones(3), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="needs values"):
        rl.compute_advantages(config("gae"), jnp.ones(3), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="needs kl"):
        rl.compute_advantages(config("dr_grpo", kl_coef=0.1, kl_in_reward=True), jnp.ones((1, 3)), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"mask must be \[B, T\]"):
        rl.compute_advantages(config("dr_grpo"), jnp.ones((1, 3)), jnp.ones((4, 2)))


def test_register_advantage_estimator_extends_the_registry():
    name = "test_reward_as_advantage"
    if name not in rl.ADVANTAGE_ESTIMATORS:

        @rl.register_advantage_estimator(name)
        def reward_as_advantage(cfg, batch):
            return batch.rewards[:, None] * batch.mask

    advantages = rl.compute_advantages(config(name), jnp.array([2.0, 3.0]), jnp.array([[1.0, 0.0], [1.0, 1.0]]))
    np.testing.assert_allclose(advantages, [[2, 0], [3, 3]])
    with pytest.raises(ValueError, match="already registered"):
        rl.register_advantage_estimator(name)(lambda cfg, batch: batch.rewards)
    assert dataclasses.replace(config(name)).advantage_estimator == name


def test_grouped_layout_accepts_masks_and_values_shaped_by_group():
    # rewards [1 group, 2 samples], mask [1, 2, T]; GAE with gamma = lambda = 1 and zero values: A = reward.
    config_gae = config("gae")
    mask = jnp.array([[[1, 1, 0], [1, 0, 0]]], jnp.float32)
    advantages = rl.compute_advantages(config_gae, jnp.array([[2.0, -1.0]]), mask, values=jnp.zeros((1, 2, 3)))
    np.testing.assert_allclose(advantages, [[2, 2, 0], [-1, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(per_sequence(rl.compute_advantages(config("dr_grpo"), jnp.array([[2.0, -1.0]]), mask)), [1.5, -1.5])


def test_a_config_knows_the_built_in_estimators_by_name_alone():
    from rlax_core.rl.advantages import ADVANTAGE_ESTIMATORS
    from rlax_core.rl.config import BUILT_IN_ESTIMATORS, known_estimators

    built_in = {name for name, estimator in ADVANTAGE_ESTIMATORS.items()
                if estimator.fn.__module__ == "rlax_core.rl.advantages"}
    assert built_in == set(BUILT_IN_ESTIMATORS)
    assert set(ADVANTAGE_ESTIMATORS) <= set(known_estimators())  # and a user's, once registered
    with pytest.raises(ConfigError, match="one of dr_grpo, gae, grpo"):
        rl.AlgorithmConfig(advantage_estimator="grpoo")
