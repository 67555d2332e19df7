"""The policy objective and the value loss on tiny inputs, with expected values worked out by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core import rl


def cfg(**fields):
    fields.setdefault("loss_aggregation", "token_mean")
    return rl.AlgorithmConfig(**fields)


def ratios_to_logprobs(ratios, old=-1.0):
    """(logprobs, old_logprobs) whose per-token ratio is ``ratios``."""
    old_logprobs = jnp.full(jnp.shape(ratios), old, jnp.float32)
    return old_logprobs + jnp.log(jnp.asarray(ratios, jnp.float32)), old_logprobs


def finite_difference_grad(fn, x, eps=1e-3):
    """Central differences of scalar ``fn`` at ``x``, all evaluated in one vmapped call.

    float32 is enough: the inputs sit away from the losses' kinks, and the error (eps^2 terms plus
    rounding / eps) stays near 1e-4.
    """
    x = np.asarray(x, np.float32)
    steps = np.eye(x.size, dtype=np.float32).reshape((x.size,) + x.shape) * eps
    values = jax.vmap(fn)(jnp.concatenate([x + steps, x - steps]))
    return (np.asarray(values[: x.size]) - np.asarray(values[x.size :])).reshape(x.shape) / (2 * eps)


# ----------------------------------------------------------------------------- aggregation


def test_aggregation_modes_by_hand():
    # Row 0: 3 tokens [1, 2, 3]; row 1: 1 token [4]; row 2: padding (ignored everywhere).
    per_token = jnp.array([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0], [70.0, 80.0, 90.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], jnp.float32)
    assert rl.aggregate(per_token, mask, "token_mean") == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert rl.aggregate(per_token, mask, "seq_mean_token_mean") == pytest.approx((2 + 4) / 2)  # 3
    assert rl.aggregate(per_token, mask, "seq_sum_norm", max_length=5) == pytest.approx((6 / 5 + 4 / 5) / 2)  # 1
    with pytest.raises(ValueError, match="max_length"):
        rl.aggregate(per_token, mask, "seq_sum_norm")
    with pytest.raises(ValueError, match="unknown aggregation"):
        rl.aggregate(per_token, mask, "mean")


# ----------------------------------------------------------------------------- the clipped surrogate


def test_ppo_clipped_surrogate_by_hand():
    # eps 0.2. Per token max(-A r, -A clip(r, 0.8, 1.2)):
    #   r=1.5 A=+1 -> max(-1.5, -1.2) = -1.2   (clipped high)
    #   r=0.5 A=-1 -> max( 0.5,  0.8) =  0.8   (clipped low)
    #   r=1.1 A=+2 -> max(-2.2, -2.2) = -2.2
    #   r=0.7 A=+1 -> max(-0.7, -0.8) = -0.7   (ratio low but A > 0: not clipped)
    logprobs, old = ratios_to_logprobs([[1.5, 0.5, 1.1, 0.7]])
    advantages = jnp.array([[1.0, -1.0, 2.0, 1.0]])
    loss, metrics = rl.policy_loss(cfg(), logprobs, old, advantages, jnp.ones((1, 4)))
    assert loss == pytest.approx((-1.2 + 0.8 - 2.2 - 0.7) / 4, abs=1e-6)
    assert metrics["clip_frac_high"] == pytest.approx(0.25)
    assert metrics["clip_frac_low"] == pytest.approx(0.25)
    assert metrics["ratio_max"] == pytest.approx(1.5) and metrics["ratio_min"] == pytest.approx(0.5)
    assert metrics["advantage_mean"] == pytest.approx(0.75)


def test_dapo_clip_higher_moves_only_the_upper_bound():
    # eps_high 0.28: the first token becomes max(-1.5, -1.28) = -1.28; the others as above.
    logprobs, old = ratios_to_logprobs([[1.5, 0.5, 1.1, 0.7]])
    advantages = jnp.array([[1.0, -1.0, 2.0, 1.0]])
    loss, _ = rl.policy_loss(cfg(clip_eps_high=0.28), logprobs, old, advantages, jnp.ones((1, 4)))
    assert loss == pytest.approx((-1.28 + 0.8 - 2.2 - 0.7) / 4, abs=1e-6)


def test_dual_clip_bounds_negative_advantage_losses():
    # A = -1, c = 3: r=5 -> max(5, 0.8)=5 then min(5, 3) = 3;  r=2 -> 2 (below c);  A=+1, r=5 -> -1.2.
    logprobs, old = ratios_to_logprobs([[5.0, 2.0, 5.0]])
    loss, metrics = rl.policy_loss(cfg(dual_clip_c=3.0), logprobs, old, jnp.array([[-1.0, -1.0, 1.0]]), jnp.ones((1, 3)))
    assert loss == pytest.approx((3 + 2 - 1.2) / 3, abs=1e-5)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 3)


def test_clipped_gradient_matches_finite_differences():
    # Ratios inside and outside the clip range, both signs of A, a masked token, two rows.
    logprobs, old = ratios_to_logprobs([[1.1, 0.6, 1.5, 0.95], [0.9, 1.3, 1.0, 1.0]])
    advantages = jnp.array([[1.0, -0.5, 2.0, -1.0], [-2.0, 1.0, 0.3, 0.0]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]], jnp.float32)
    # With a TIS weight (a constant of old and behaviour log-probs) and a k3 KL term.
    behavior = old + jnp.array([[0.1, -1.0, 0.3, 0.0], [2.0, 0.0, -0.2, 0.0]])
    ref = old - 0.5
    config = cfg(loss_aggregation="seq_mean_token_mean", clip_eps_high=0.28, dual_clip_c=3.0, kl_coef=0.1, mismatch_correction="tis")
    fn = lambda lp: rl.policy_loss(config, lp, old, advantages, mask, ref_logprobs=ref, behavior_logprobs=behavior)[0]
    np.testing.assert_allclose(jax.grad(fn)(logprobs), finite_difference_grad(fn, logprobs), atol=2e-3)


# ----------------------------------------------------------------------------- CISPO


def test_cispo_by_hand():
    # Weight clip(r, 1 - 1, 1 + 0.5) = clip(r, 0, 1.5), stop-gradient; l = -w A log pi.
    #   r=2.0 A=+1 log pi=-1 -> w=1.5: -1.5 * 1 * -1 =  1.5
    #   r=0.5 A=-1 log pi=-2 -> w=0.5: -0.5 * -1 * -2 = -1.0      mean 0.25
    # d loss / d log pi = -w A / N = [-0.75, 0.25]: the weight does not depend on log pi in the graph.
    logprobs = jnp.array([[-1.0, -2.0]])
    old = logprobs - jnp.log(jnp.array([[2.0, 0.5]]))
    config = cfg(policy_loss="cispo", clip_eps_low=1.0, clip_eps_high=0.5)
    loss, metrics = rl.policy_loss(config, logprobs, old, jnp.array([[1.0, -1.0]]), jnp.ones((1, 2)))
    assert loss == pytest.approx(0.25, abs=1e-6)
    assert metrics["clip_frac_high"] == pytest.approx(0.5) and metrics["clip_frac_low"] == 0
    grad = jax.grad(lambda lp: rl.policy_loss(config, lp, old, jnp.array([[1.0, -1.0]]), jnp.ones((1, 2)))[0])(logprobs)
    np.testing.assert_allclose(grad, [[-0.75, 0.25]], atol=1e-6)


def test_cispo_gradient_matches_finite_differences_along_a_fixed_weight():
    # CISPO's gradient is the REINFORCE gradient scaled by a *constant* weight, so it is the derivative
    # of the loss along moves that leave the ratio (hence the weight) unchanged: shift log pi and
    # log pi_old together.
    logprobs = jnp.array([[-1.0, -2.0, -0.5], [-1.5, -0.2, -3.0]])
    old = logprobs - jnp.log(jnp.array([[2.0, 0.5, 1.1], [5.0, 0.9, 1.0]]))
    advantages = jnp.array([[1.0, -1.0, 0.5], [2.0, -0.3, 1.0]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)
    config = cfg(policy_loss="cispo", clip_eps_low=1.0, clip_eps_high=3.0)
    grad = jax.grad(lambda lp: rl.policy_loss(config, lp, old, advantages, mask)[0])(logprobs)
    along_fixed_weight = lambda lp: rl.policy_loss(config, lp, lp - (logprobs - old), advantages, mask)[0]
    np.testing.assert_allclose(grad, finite_difference_grad(along_fixed_weight, logprobs), atol=2e-3)


# ----------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_by_hand():
    # Row 0 log-ratios [0.1, 0.3] -> sequence log-ratio 0.2, s = e^0.2 = 1.221 > 1.2, A = +1: clipped, l = -1.2.
    # Row 1 log-ratios [0, -0.2, 0.2] -> s = 1, A = -1: l = 1. seq_mean_token_mean: (-1.2 + 1) / 2 = -0.1.
    # Gradient: row 0 clipped -> 0; row 1: (1/2) * mean_t(-A s) -> d/dlog pi_t = (1/2)(1)(1)(1/3) = 1/6.
    old = jnp.zeros((2, 3))
    logprobs = jnp.array([[0.1, 0.3, 7.0], [0.0, -0.2, 0.2]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]], jnp.float32)
    advantages = jnp.array([1.0, -1.0])
    config = cfg(importance_ratio="sequence", loss_aggregation="seq_mean_token_mean")
    fn = lambda lp: rl.policy_loss(config, lp, old, advantages, mask)[0]
    assert fn(logprobs) == pytest.approx(-0.1, abs=1e-6)
    np.testing.assert_allclose(jax.grad(fn)(logprobs), [[0, 0, 0], [1 / 6] * 3], atol=1e-6)
    # Unclipped everywhere (wide eps) so the finite-difference check sees a smooth function.
    wide = cfg(importance_ratio="sequence", loss_aggregation="seq_mean_token_mean", clip_eps_high=0.5)
    fn = lambda lp: rl.policy_loss(wide, lp, old, advantages, mask)[0]
    np.testing.assert_allclose(jax.grad(fn)(logprobs), finite_difference_grad(fn, logprobs), atol=2e-3)


# ----------------------------------------------------------------------------- KL and entropy


def test_kl_estimators_by_hand():
    # pi = 0.5, pi_ref = 0.25: log_r = log(0.25 / 0.5) = -log 2.
    # k1 = log 2; k2 = (log 2)^2 / 2; k3 = 0.5 - 1 + log 2.
    lp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
    log2 = np.log(2)
    assert rl.kl_estimate(lp, ref, "k1")[0] == pytest.approx(log2, abs=1e-6)
    assert rl.kl_estimate(lp, ref, "k2")[0] == pytest.approx(log2**2 / 2, abs=1e-6)
    assert rl.kl_estimate(lp, ref, "k3")[0] == pytest.approx(0.5 - 1 + log2, abs=1e-6)
    assert all(rl.kl_estimate(lp, lp, k)[0] == 0 for k in ("k1", "k2", "k3"))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_the_loss_adds_coef_times_the_estimate_and_its_gradient(estimator):
    # A = 0 leaves only 0.1 * KL; with two equal tokens the token mean is that KL.
    # d/dlog pi: k1 -> 1; k2 -> -(log_r) = log 2; k3 -> 1 - exp(log_r) = 1 - 0.5.
    lp = jnp.log(jnp.full((1, 2), 0.5))
    ref = jnp.log(jnp.full((1, 2), 0.25))
    config = cfg(kl_coef=0.1, kl_estimator=estimator)
    fn = lambda x: rl.policy_loss(config, x, jax.lax.stop_gradient(x), jnp.zeros((1, 2)), jnp.ones((1, 2)), ref_logprobs=ref)
    loss, metrics = fn(lp)
    expected_kl = {"k1": np.log(2), "k2": np.log(2) ** 2 / 2, "k3": 0.5 - 1 + np.log(2)}[estimator]
    assert loss == pytest.approx(0.1 * expected_kl, abs=1e-6)
    assert metrics["kl_ref"] == pytest.approx(expected_kl, abs=1e-6)
    slope = {"k1": 1.0, "k2": np.log(2), "k3": 0.5}[estimator]
    np.testing.assert_allclose(jax.grad(lambda x: fn(x)[0])(lp), [[0.1 * slope / 2] * 2], atol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda x: fn(x)[0])(lp), finite_difference_grad(lambda x: fn(x)[0], lp), atol=2e-3
    )


def test_kl_in_reward_keeps_it_out_of_the_loss_but_logs_it():
    lp, ref = jnp.log(jnp.full((1, 2), 0.5)), jnp.log(jnp.full((1, 2), 0.25))
    config = cfg(kl_coef=0.1, kl_in_reward=True, kl_estimator="k1")
    loss, metrics = rl.policy_loss(config, lp, lp, jnp.zeros((1, 2)), jnp.ones((1, 2)), ref_logprobs=ref)
    assert loss == 0 and metrics["kl_ref"] == pytest.approx(np.log(2), abs=1e-6)


def test_entropy_bonus_by_hand():
    # A = 0, entropy [1, 3] (the third token is masked), coef 0.1 -> loss = -0.1 * 2.
    lp = jnp.zeros((1, 3))
    loss, metrics = rl.policy_loss(
        cfg(entropy_coef=0.1), lp, lp, jnp.zeros((1, 3)), jnp.array([[1.0, 1.0, 0.0]]), entropy=jnp.array([[1.0, 3.0, 100.0]])
    )
    assert loss == pytest.approx(-0.2, abs=1e-6) and metrics["entropy"] == pytest.approx(2.0)


# ----------------------------------------------------------------------------- training-inference mismatch


def test_tis_truncates_the_behaviour_weight():
    # rho = pi_old / mu = [3, 0.5]; TIS cap 2 -> w = [2, 0.5]. Ratio 1, A = 1: l = -w; mean -1.25.
    # mismatch KL (k3 of mu vs pi_old) = mean(rho - 1 - log rho).
    lp = jnp.zeros((1, 2))
    behavior = lp - jnp.log(jnp.array([[3.0, 0.5]]))
    loss, metrics = rl.policy_loss(
        cfg(mismatch_correction="tis", mismatch_high=2.0), lp, lp, jnp.ones((1, 2)), jnp.ones((1, 2)), behavior_logprobs=behavior
    )
    assert loss == pytest.approx(-1.25, abs=1e-6)
    assert metrics["mismatch_corrected_frac"] == pytest.approx(0.5)
    assert metrics["mismatch_kl"] == pytest.approx(np.mean([2 - np.log(3), -0.5 - np.log(0.5)]), abs=1e-6)


def test_mis_masks_tokens_outside_the_band():
    # rho = [3, 0.5, 1.5], band [0.6, 2] -> w = [0, 0, 1.5]; A = 1: mean(-w) = -0.5.
    lp = jnp.zeros((1, 3))
    behavior = lp - jnp.log(jnp.array([[3.0, 0.5, 1.5]]))
    config = cfg(mismatch_correction="mis", mismatch_low=0.6, mismatch_high=2.0)
    loss, metrics = rl.policy_loss(config, lp, lp, jnp.ones((1, 3)), jnp.ones((1, 3)), behavior_logprobs=behavior)
    assert loss == pytest.approx(-0.5, abs=1e-6)
    assert metrics["mismatch_corrected_frac"] == pytest.approx(2 / 3)


def test_sequence_level_mis_uses_the_geometric_mean():
    # Row 0: rho [3, 3] -> geometric mean 3, outside [0.5, 2]: masked. Row 1: rho [2, 0.5] -> 1: kept.
    # seq_mean_token_mean with A = 1: (0 + -1) / 2 = -0.5.
    lp = jnp.zeros((2, 2))
    behavior = lp - jnp.log(jnp.array([[3.0, 3.0], [2.0, 0.5]]))
    config = cfg(mismatch_correction="mis", mismatch_level="sequence", mismatch_low=0.5, loss_aggregation="seq_mean_token_mean")
    loss, _ = rl.policy_loss(config, lp, lp, jnp.ones((2, 2)), jnp.ones((2, 2)), behavior_logprobs=behavior)
    assert loss == pytest.approx(-0.5, abs=1e-6)


# ----------------------------------------------------------------------------- value loss


def test_value_loss_by_hand_and_against_finite_differences():
    # Unclipped: 0.5 (V - R)^2 = 0.5 * [0.25, 1] -> token mean 0.3125.
    # Clipped at 0.2 around old [0, 0]: V [0.5, -1] -> [0.2, -0.2]; 0.5 (clip - R)^2 = 0.5 * [0.04, 0.04]
    # -> max per token [0.125, 0.5]: the clipped term never wins here, so the loss is the same.
    values, old, returns = jnp.array([[0.5, -1.0]]), jnp.zeros((1, 2)), jnp.array([[0.0, 0.0]])
    loss, _ = rl.value_loss(cfg(), values, old, returns, jnp.ones((1, 2)))
    assert loss == pytest.approx(0.3125)
    # Returns beyond the clip range: R = [1, 1], V = [0.5, 0.1], old = 0 -> clipped V = [0.2, 0.1];
    # unclipped 0.5 [0.25, 0.81], clipped 0.5 [0.64, 0.81] -> max: 0.5 [0.64, 0.81] -> mean 0.3625.
    config = cfg(value_clip_eps=0.2)
    values, returns = jnp.array([[0.5, 0.1]]), jnp.ones((1, 2))
    loss, metrics = rl.value_loss(config, values, old, returns, jnp.ones((1, 2)))
    assert loss == pytest.approx(0.5 * (0.64 + 0.81) / 2, abs=1e-6)
    assert metrics["value_clip_frac"] == pytest.approx(0.5)
    fn = lambda v: rl.value_loss(config, v, old, returns, jnp.ones((1, 2)))[0]
    np.testing.assert_allclose(jax.grad(fn)(values), finite_difference_grad(fn, values), atol=2e-3)


# ----------------------------------------------------------------------------- errors


def test_missing_inputs_fail_clearly():
    lp = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        rl.policy_loss(cfg(kl_coef=0.1), lp, lp, lp, jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="needs the per-token entropy"):
        rl.policy_loss(cfg(entropy_coef=0.1), lp, lp, lp, jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="needs behavior_logprobs"):
        rl.policy_loss(cfg(mismatch_correction="tis"), lp, lp, lp, jnp.ones((1, 2)))


def test_behaviour_logprobs_without_a_correction_are_only_measured():
    # No correction: weights stay 1 (loss = -mean A = -1), but the mismatch KL is still logged.
    lp = jnp.zeros((1, 2))
    behavior = lp - jnp.log(jnp.array([[3.0, 0.5]]))
    loss, metrics = rl.policy_loss(cfg(), lp, lp, jnp.ones((1, 2)), jnp.ones((1, 2)), behavior_logprobs=behavior)
    assert loss == pytest.approx(-1.0) and metrics["mismatch_weight_mean"] == 1.0
    assert metrics["mismatch_kl"] == pytest.approx(np.mean([2 - np.log(3), -0.5 - np.log(0.5)]), abs=1e-6)


def test_approx_kl_to_old_is_k3_of_old_against_current():
    # pi / pi_old = 2 on both tokens: k3 with log_r = log(pi / pi_old) = log 2 -> 2 - 1 - log 2.
    logprobs, old = ratios_to_logprobs([[2.0, 2.0]])
    _, metrics = rl.policy_loss(cfg(clip_eps_high=5.0), logprobs, old, jnp.ones((1, 2)), jnp.ones((1, 2)))
    assert metrics["approx_kl_old"] == pytest.approx(1 - np.log(2), abs=1e-6)
