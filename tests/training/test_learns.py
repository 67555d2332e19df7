"""It learns: with a reward that favours one token, a few dozen GRPO steps raise that token's probability."""

import jax
import numpy as np
import pytest

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.models import toy_config
from rlax_core.rl.presets import get_preset
from rlax_core.training.batching import make_batch
from rlax_core.training.config import MeshConfig, OptimizerConfig, TrainerConfig
from rlax_core.training.mesh import make_mesh
from rlax_core.training.step import Trainer, token_logprobs

from training_helpers import rollout_rows, sample

TARGET = 7
PROMPTS, SAMPLES, PROMPT_LEN, NEW_TOKENS = 8, 8, 4, 8


def target_probability(params, config, prompts):
    tokens = np.concatenate([prompts, np.full((len(prompts), 1), TARGET)], axis=1)
    logprobs, _ = token_logprobs(params, config, tokens, np.ones_like(tokens))
    return float(np.mean(np.exp(logprobs[:, -1])))


@pytest.mark.slow
def test_rewarding_a_token_raises_its_probability(tmp_path):
    model = toy_config()
    trainer_config = TrainerConfig(max_seq_len=PROMPT_LEN + NEW_TOKENS, mesh=MeshConfig(fsdp=1),
                                   optimizer=OptimizerConfig(learning_rate=3e-3))
    trainer = Trainer(model, get_preset("grpo"), trainer_config, make_mesh(trainer_config.mesh, jax.devices()[:1]))
    state = trainer.init_state()
    reference = jax.tree.map(jax.numpy.copy, state.params)  # GRPO keeps a KL to the initial policy
    store = RolloutStore(tmp_path, run="learn")  # names the groups; nothing is written
    rng = np.random.default_rng(0)
    held_out = rng.integers(3, model.vocab_size, (32, PROMPT_LEN))
    before = target_probability(state.params, model, held_out)
    rewards_seen = []
    for step in range(30):
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
        state, metrics = trainer.step(state, make_batch(tables, max_seq_len=PROMPT_LEN + NEW_TOKENS), reference)
        assert float(metrics["mismatch_kl"]) < 1e-3  # the sampler and the trainer agree on log-probs
    after = target_probability(state.params, model, held_out)
    print(f"p(target) {before:.4f} -> {after:.4f}; reward {rewards_seen[0]:.3f} -> {np.mean(rewards_seen[-5:]):.3f}")
    assert after > 5 * before and after > 0.05
    assert np.mean(rewards_seen[-5:]) > 3 * max(np.mean(rewards_seen[:5]), 1 / model.vocab_size)
