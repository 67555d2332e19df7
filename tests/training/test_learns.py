"""It learns: with a reward that favours one token, a few dozen GRPO (or PPO) steps raise that token's probability."""

import jax
import numpy as np
import pytest

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.models import toy_config
from rlax_core.rl.presets import get_preset
from rlax_core.training.batching import make_batch
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.training.config import OptimizerConfig, TrainerConfig, ValueModelConfig
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.step import Trainer

from training_helpers import rollout_rows, sample

TARGET = 7
PROMPTS, SAMPLES, PROMPT_LEN, NEW_TOKENS = 8, 8, 4, 8


def target_probability(params, config, prompts):
    tokens = np.concatenate([prompts, np.full((len(prompts), 1), TARGET)], axis=1)
    logprobs, _ = token_logprobs(params, config, tokens, np.ones_like(tokens))
    return float(np.mean(np.exp(logprobs[:, -1])))


def train_on_token_reward(trainer: Trainer, tmp_path, steps: int = 30) -> tuple[float, float, list[float]]:
    """Sample, reward the share of TARGET tokens, update; p(TARGET) on held-out prompts before and after."""
    model = trainer.model_config
    state = trainer.init_state()
    reference = jax.tree.map(jax.numpy.copy, state.params)  # the KL is to the initial policy
    store = RolloutStore(tmp_path, run="learn")  # names the groups; nothing is written
    rng = np.random.default_rng(0)
    held_out = rng.integers(3, model.vocab_size, (32, PROMPT_LEN))
    before = target_probability(state.params, model, held_out)
    rewards_seen = []
    for step in range(steps):
        prompts = rng.integers(3, model.vocab_size, (PROMPTS, PROMPT_LEN))
        rows = np.repeat(prompts, SAMPLES, axis=0)
        completions, logps = sample(state.params, model, rows, NEW_TOKENS, jax.random.key(step))
        rewards = (completions == TARGET).mean(axis=1)
        rewards_seen.append(rewards.mean())
        tables = []
        for g in range(PROMPTS):
            key, rows_of_group = GroupKey(step, g), slice(g * SAMPLES, (g + 1) * SAMPLES)
            tables.append(to_table(rollout_rows(store, key, prompts[g], completions[rows_of_group], logps[rows_of_group],
                                                rewards[rows_of_group], version=step), ROLLOUT_SCHEMA))
        batch = make_batch(tables, max_seq_len=PROMPT_LEN + NEW_TOKENS, row_multiple=trainer.row_multiple)
        state, metrics = trainer.step(state, batch, reference)
        assert float(metrics["mismatch_kl"]) < 1e-3  # the sampler and the trainer agree on log-probs
    return before, target_probability(state.params, model, held_out), rewards_seen


def single_device_trainer(algorithm, **fields) -> Trainer:
    config = TrainerConfig(max_seq_len=PROMPT_LEN + NEW_TOKENS, mesh=MeshConfig(fsdp=1),
                           optimizer=OptimizerConfig(learning_rate=3e-3), **fields)
    return Trainer(toy_config(), algorithm, config, make_mesh(config.mesh, jax.devices()[:1]))


@pytest.mark.slow
def test_rewarding_a_token_raises_its_probability(tmp_path):
    before, after, rewards_seen = train_on_token_reward(single_device_trainer(get_preset("grpo")), tmp_path)
    print(f"p(target) {before:.4f} -> {after:.4f}; reward {rewards_seen[0]:.3f} -> {np.mean(rewards_seen[-5:]):.3f}")
    assert after > 5 * before and after > 0.05
    assert np.mean(rewards_seen[-5:]) > 3 * max(np.mean(rewards_seen[:5]), 1 / toy_config().vocab_size)


@pytest.mark.slow
def test_ppo_with_a_value_model_raises_its_probability(tmp_path):
    # PPO as published (GAE from a critic, KL in the reward), 2 epochs x 2 mini-batches per batch.
    ppo = single_device_trainer(get_preset("ppo"), ppo_epochs=2, mini_batches=2,
                                value_model=ValueModelConfig(OptimizerConfig(learning_rate=1e-2)))
    before, after, rewards_seen = train_on_token_reward(ppo, tmp_path)
    print(f"PPO p(target) {before:.4f} -> {after:.4f}; reward {rewards_seen[0]:.3f} -> {np.mean(rewards_seen[-5:]):.3f}")
    assert after > 5 * before and after > 0.05
    assert np.mean(rewards_seen[-5:]) > 3 * max(np.mean(rewards_seen[:5]), 1 / toy_config().vocab_size)
