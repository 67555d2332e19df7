"""In a training graph: the ratio of a policy with itself is exactly 1, and every preset then takes the
on-policy REINFORCE gradient.

The "model" is a tiny softmax policy over a vocabulary (logits = features @ W), enough to make the
log-probs a differentiable function of parameters the way the trainer's are.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core import rl

B, T, D, V = 4, 5, 3, 7


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return {
        "params": jnp.asarray(rng.normal(size=(D, V)), jnp.float32),
        "features": jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32),
        "tokens": jnp.asarray(rng.integers(0, V, size=(B, T))),
        "mask": jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], jnp.float32),
        "advantages": jnp.asarray(rng.normal(size=(B, T)), jnp.float32),
        "ref_logprobs": jnp.asarray(-rng.uniform(0.5, 3.0, size=(B, T)), jnp.float32),
    }


def policy_logprobs_and_entropy(params, batch):
    """log pi(token) and the entropy of pi at every position, in float32 as the trainer computes them."""
    log_probs = jax.nn.log_softmax(batch["features"] @ params, axis=-1)
    token_logprobs = jnp.take_along_axis(log_probs, batch["tokens"][..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return token_logprobs, entropy


def test_ratio_of_a_policy_with_itself_is_exactly_one(batch):
    def loss_fn(params, config):
        logprobs, _ = policy_logprobs_and_entropy(params, batch)
        old = jax.lax.stop_gradient(logprobs)
        ratio = jnp.exp(rl.log_importance_ratio(logprobs, old, batch["mask"], config.importance_ratio))
        loss, metrics = rl.policy_loss(config, logprobs, old, batch["advantages"], batch["mask"], ref_logprobs=batch["ref_logprobs"])
        return loss, (ratio, metrics)

    for name in ("grpo", "gspo"):  # token-level and sequence-level ratios
        config = rl.get_preset(name)
        _, (ratio, metrics) = jax.jit(jax.grad(loss_fn, has_aux=True), static_argnums=1)(batch["params"], config)
        assert np.all(np.asarray(ratio) == 1.0), name
        assert float(metrics["ratio_min"]) == 1.0 and float(metrics["ratio_max"]) == 1.0, name
        assert float(metrics["clip_frac_low"]) == 0.0 and float(metrics["clip_frac_high"]) == 0.0


@pytest.mark.parametrize("name", sorted(rl.PRESETS))
def test_each_preset_at_ratio_one_takes_the_reinforce_gradient(batch, name):
    config = rl.get_preset(name, entropy_coef=0.01)  # exercise the entropy term in every preset too
    kl_in_loss = config.kl_coef > 0 and not config.kl_in_reward
    mask, advantages, ref = batch["mask"], batch["advantages"], batch["ref_logprobs"]

    def preset_loss(params):
        logprobs, entropy = policy_logprobs_and_entropy(params, batch)
        old = jax.lax.stop_gradient(logprobs)
        return rl.policy_loss(config, logprobs, old, advantages, mask, ref_logprobs=ref, entropy=entropy)[0]

    def reinforce_loss(params):
        # On-policy REINFORCE: -A log pi, plus the preset's regularisers, weighed as the preset weighs tokens.
        logprobs, entropy = policy_logprobs_and_entropy(params, batch)
        per_token = -advantages * logprobs - config.entropy_coef * entropy
        if kl_in_loss:
            per_token = per_token + config.kl_coef * rl.kl_estimate(logprobs, ref, config.kl_estimator)
        if config.importance_ratio == "sequence":
            # GSPO's gradient at s = 1 is A_i * mean_t grad log pi: REINFORCE on the sequence-mean advantage.
            seq_adv = jnp.sum(advantages * mask, 1, keepdims=True) / jnp.sum(mask, 1, keepdims=True)
            per_token = per_token + (advantages - seq_adv) * logprobs
        return rl.aggregate(per_token, mask, config.loss_aggregation, config.loss_max_length)

    got = jax.jit(jax.grad(preset_loss))(batch["params"])
    want = jax.jit(jax.grad(reinforce_loss))(batch["params"])
    scale = float(jnp.max(jnp.abs(want)))
    assert scale > 0  # the comparison is not between two zeros (seq_sum_norm's constant makes it small)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)
