"""PPO in the trainer: the critic's GAE advantages, the KL in the reward, epochs and mini-batches.

Each check compares the trainer's in-graph numbers with NumPy computed here from independently
evaluated log-probs and values.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.config import ConfigError, from_dict
from rlax_core.models.config import toy_config
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.presets import get_preset
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.training.config import OptimizerConfig, TrainerConfig, ValueModelConfig
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.step import Trainer
from rlax_core.training.value_model import token_values
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

from test_step import batch_from_store

MODEL = toy_config()
PPO = get_preset("ppo")


def trainer(algorithm, **overrides):
    fields = dict(max_seq_len=16, mesh=MeshConfig(fsdp=1), optimizer=OptimizerConfig(learning_rate=1e-3, eps=1e-4))
    config = TrainerConfig(**{**fields, **overrides})
    return Trainer(MODEL, algorithm, config, make_mesh(config.mesh, jax.devices()[:1]))


def with_random_value_head(state):
    """A critic that predicts something: the zero-initialised head would make every value 0."""
    head = {"kernel": 0.5 * jax.random.normal(jax.random.key(7), (MODEL.hidden_size,)), "bias": jnp.float32(0.3)}
    return state.replace(value_params={**state.value_params, "value_head": head})


def perturbed(params, scale=0.05, seed=3):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def logprobs_of(params, batch):
    return np.asarray(token_logprobs(params, MODEL, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))[0])


def values_of(value_params, batch):
    return np.asarray(token_values(value_params, MODEL, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"])))


def numpy_gae(token_rewards, values, mask, gamma, lam):
    """Schulman et al. 2016 eq. 16 row by row over the completion tokens; V after the last token is 0."""
    advantages = np.zeros_like(values)
    for i in range(len(mask)):
        positions = np.nonzero(mask[i])[0]
        next_value = next_advantage = 0.0
        for t in positions[::-1]:
            delta = token_rewards[i, t] + gamma * next_value - values[i, t]
            next_advantage = delta + gamma * lam * next_advantage
            advantages[i, t], next_value = next_advantage, values[i, t]
    return advantages, (advantages + values) * mask


def numpy_whiten(x, mask, eps):
    chosen = x[mask > 0]
    return (x - chosen.mean()) / (chosen.std() + eps) * mask


def outcome_on_last_token(rewards, mask):
    token_rewards = np.zeros(mask.shape)
    for i in range(len(mask)):
        positions = np.nonzero(mask[i])[0]
        if len(positions):
            token_rewards[i, positions[-1]] = rewards[i]
    return token_rewards


def numpy_grpo(rewards, group_ids, sample_mask, eps):
    advantages = np.zeros_like(rewards)
    for g in set(group_ids[sample_mask > 0].tolist()):
        rows = (group_ids == g) & (sample_mask > 0)
        r = rewards[rows]
        advantages[rows] = 0.0 if np.all(r == r[0]) else (r - r.mean()) / (r.std(ddof=1) + eps)
    return advantages


# ----------------------------------------------------------------------------- config


def test_epoch_and_value_model_keys_are_validated_with_their_paths():
    with pytest.raises(ConfigError, match="ppo_epochs"):
        TrainerConfig(ppo_epochs=0)
    with pytest.raises(ConfigError, match="mini_batches"):
        TrainerConfig(mini_batches=0)
    with pytest.raises(ConfigError, match=r"trainer\.value_model\.optimizer\.learning_rate"):
        from_dict(TrainerConfig, {"value_model": {"optimizer": {"learning_rate": 0}}}, "trainer")
    config = from_dict(TrainerConfig, {"ppo_epochs": 2, "mini_batches": 4,
                                       "value_model": {"optimizer": {"learning_rate": 5e-5}}}, "trainer")
    assert config.value_model.optimizer.learning_rate == 5e-5 and config.ppo_epochs * config.mini_batches == 8


# ----------------------------------------------------------------------------- the critic's advantages


@pytest.mark.slow
def test_gae_advantages_from_the_critic_match_numpy(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = dataclasses.replace(PPO, kl_coef=0.0, gamma=0.9, gae_lambda=0.8)
    ppo = trainer(algorithm)
    state = with_random_value_head(ppo.init_state())
    prepared = jax.device_get(ppo.prepare_batch(state, batch))
    mask = batch["loss_mask"]
    values = values_of(state.value_params, batch) * mask
    # Relative too: values reach ~6 here, and the trainer's fused projections (CPU) round differently
    # from the plain forward in the last bits (2e-6 seen at 2.5).
    np.testing.assert_allclose(prepared["old_values"], values, rtol=1e-6, atol=1e-6)
    assert np.abs(values[mask > 0]).min() > 1e-3  # a critic that says something, so GAE is not REINFORCE
    advantages, returns = numpy_gae(outcome_on_last_token(batch["rewards"], mask), values, mask, 0.9, 0.8)
    np.testing.assert_allclose(prepared["returns"], returns, atol=1e-5)
    np.testing.assert_allclose(prepared["advantages"], numpy_whiten(advantages, mask, algorithm.std_eps), atol=1e-4)


@pytest.mark.slow
def test_kl_in_reward_shapes_token_rewards_before_gae(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = dataclasses.replace(PPO, kl_coef=0.5, kl_estimator="k1", whiten_advantages=False)
    ppo = trainer(algorithm)
    state = with_random_value_head(ppo.init_state())
    reference = perturbed(state.params)
    prepared = jax.device_get(ppo.prepare_batch(state, batch, reference))
    mask = batch["loss_mask"]
    kl = (logprobs_of(state.params, batch) - logprobs_of(reference, batch)) * mask  # k1 of pi_old vs pi_ref
    np.testing.assert_allclose(prepared["kl"], kl, atol=1e-5)
    assert np.abs(kl).max() > 0.05
    token_rewards = outcome_on_last_token(batch["rewards"], mask) - 0.5 * kl  # InstructGPT eq. 2, per token
    advantages, returns = numpy_gae(token_rewards, values_of(state.value_params, batch) * mask, mask, 1.0, 0.95)
    np.testing.assert_allclose(prepared["advantages"], advantages, atol=1e-4)
    np.testing.assert_allclose(prepared["returns"], returns, atol=1e-4)
    without_kl, _ = numpy_gae(outcome_on_last_token(batch["rewards"], mask), values_of(state.value_params, batch) * mask,
                              mask, 1.0, 0.95)
    assert np.abs(without_kl - advantages).max() > 0.05  # the penalty did change them


@pytest.mark.slow
def test_kl_in_reward_for_a_group_estimator_penalises_the_summed_kl(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = AlgorithmConfig(advantage_estimator="grpo", kl_coef=0.2, kl_estimator="k3", kl_in_reward=True)
    grpo = trainer(algorithm)
    state = grpo.init_state()
    reference = perturbed(state.params)
    prepared = jax.device_get(grpo.prepare_batch(state, batch, reference))
    mask = batch["loss_mask"]
    log_r = logprobs_of(reference, batch) - logprobs_of(state.params, batch)
    kl = (np.expm1(log_r) - log_r) * mask  # k3
    shaped = batch["rewards"] - 0.2 * kl.sum(axis=1)  # one scalar per completion: r_i - beta sum_t KL_t
    expected = numpy_grpo(shaped, batch["group_ids"], batch["sample_mask"], algorithm.std_eps)[:, None] * mask
    np.testing.assert_allclose(prepared["advantages"], expected, atol=1e-4)
    plain = numpy_grpo(batch["rewards"], batch["group_ids"], batch["sample_mask"], algorithm.std_eps)[:, None] * mask
    assert np.abs(plain - expected).max() > 0.01


# ----------------------------------------------------------------------------- epochs and mini-batches


@pytest.mark.slow
def test_old_logprobs_are_computed_once_and_held_across_epochs_and_mini_batches(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = AlgorithmConfig(advantage_estimator="grpo", loss_aggregation="token_mean")
    two_epochs = trainer(algorithm, ppo_epochs=2, mini_batches=2)
    state = two_epochs.init_state()
    initial = jax.tree.map(np.asarray, state.params)
    # The trainer's program against a plain forward: the same sums, each in the order it compiles to.
    assert_reordered_close(jax.device_get(two_epochs.prepare_batch(state, batch))["old_logprobs"],
                           logprobs_of(initial, batch) * batch["loss_mask"], decoder_logprob_bound(MODEL, context=16))
    _, _, per_update = two_epochs.step_with_update_metrics(state, batch)
    ratio_min, ratio_max = np.asarray(per_update["ratio_min"]), np.asarray(per_update["ratio_max"])
    assert ratio_min.shape == (2, 2)
    # The first update sees the weights the old log-probs came from; every later one has moved on.
    np.testing.assert_allclose([ratio_min[0, 0], ratio_max[0, 0]], 1.0, atol=1e-6)
    for epoch, mini in [(0, 1), (1, 0), (1, 1)]:
        assert max(1 - ratio_min[epoch, mini], ratio_max[epoch, mini] - 1) > 1e-3, (epoch, mini)

    # Epoch 1, slice 0 compares the weights after epoch 0 with the batch's old log-probs: rebuild both.
    one_epoch = trainer(algorithm, ppo_epochs=1, mini_batches=2)
    after_epoch_0, _ = one_epoch.step(one_epoch.init_state(initial), batch)
    rows = slice(0, None, 2)  # slice 0 of 2: rows 0, 2, 4, ...
    mask = batch["loss_mask"][rows] > 0
    ratio = np.exp(logprobs_of(after_epoch_0.params, batch)[rows] - logprobs_of(initial, batch)[rows])[mask]
    np.testing.assert_allclose([per_update["ratio_min"][1, 0], per_update["ratio_max"][1, 0],
                                per_update["ratio_mean"][1, 0]], [ratio.min(), ratio.max(), ratio.mean()], rtol=2e-4)


@pytest.mark.slow
def test_value_loss_is_clipped_around_the_frozen_old_values(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = dataclasses.replace(PPO, kl_coef=0.0, value_clip_eps=0.01)
    # A critic learning rate that moves values well past the clip range in one update.
    fields = dict(value_model=ValueModelConfig(OptimizerConfig(learning_rate=3e-2)))
    two_epochs = trainer(algorithm, ppo_epochs=2, **fields)
    state = with_random_value_head(two_epochs.init_state())
    initial = jax.tree.map(np.asarray, state)
    prepared = jax.device_get(two_epochs.prepare_batch(state, batch))
    _, _, per_update = two_epochs.step_with_update_metrics(state, batch)

    one_epoch = trainer(algorithm, **fields)
    after_one, _ = one_epoch.step(jax.device_put(initial), batch)
    mask = batch["loss_mask"]
    old, returns = prepared["old_values"], prepared["returns"]
    moved = values_of(after_one.value_params, batch) * mask
    clipped = old + np.clip(moved - old, -0.01, 0.01)
    unclipped_loss = 0.5 * np.square(moved - returns)
    clipped_loss = np.maximum(unclipped_loss, 0.5 * np.square(clipped - returns))
    token_mean = lambda x: (x * mask).sum() / mask.sum()  # the ppo preset's loss_aggregation
    assert token_mean(clipped_loss) - token_mean(unclipped_loss) > 1e-3  # the clip matters here
    np.testing.assert_allclose(per_update["value_loss"][1, 0], token_mean(clipped_loss), rtol=1e-4)
    assert per_update["value_clip_frac"][0, 0] == 0.0 and per_update["value_clip_frac"][1, 0] > 0.1


@pytest.mark.slow
def test_mini_batch_micro_batches_add_up_for_policy_and_critic(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = dataclasses.replace(PPO, kl_coef=0.0)
    whole, split = trainer(algorithm, mini_batches=2), trainer(algorithm, mini_batches=2, micro_batches=4)
    initial = with_random_value_head(whole.init_state())
    state_a, metrics_a = whole.step(jax.tree.map(jnp.copy, initial), batch)
    state_b, metrics_b = split.step(jax.tree.map(jnp.copy, initial), batch)
    for name in ("loss", "value_loss", "grad_norm", "value_grad_norm"):
        np.testing.assert_allclose(float(metrics_a[name]), float(metrics_b[name]), rtol=1e-5, atol=1e-7, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), (state_a.params, state_a.value_params),
                 (state_b.params, state_b.value_params))
