"""Training on episodes: the stored policy mask is the loss mask, and observation tokens carry no gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.envs import Episode
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import init_params
from rlax_core.rl import compute_advantages, get_preset, policy_loss
from rlax_core.training.batching import make_batch
from rlax_core.training.logprobs import token_logprobs

PROMPT = [1, 5, 9]
# turn 1 (3 tokens, version 4), observation (2), turn 2 (2 tokens, version 5), observation (3), turn 3 (1, version 5)
COMPLETION = [11, 12, 13, 40, 41, 14, 15, 42, 43, 44, 16]
POLICY_MASK = [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1]


def _episode(sample_index, reward_scale=1.0):
    logprobs = [(-0.5 - 0.1 * i) * m for i, m in enumerate(POLICY_MASK)]
    turns = [{"start": 0, "end": 3, "version": 4, "finish_reason": "stop", "text": "a", "reward": 0.5 * reward_scale,
              "observation": "o1", "info": {}},
             {"start": 5, "end": 7, "version": 5, "finish_reason": "stop", "text": "b", "reward": 0.0,
              "observation": "o2", "info": {}},
             {"start": 10, "end": 11, "version": 5, "finish_reason": "stop", "text": "c", "reward": reward_scale,
              "observation": "", "info": {}}]
    return Episode(prompt_id="p", sample_index=sample_index, seed=3, prompt_ids=PROMPT,
                   completion_ids=[t + sample_index for t in COMPLETION], policy_mask=POLICY_MASK,
                   behavior_logprobs=logprobs, turn_versions=[4, 5, 5], turns=turns, finish_reason="stop")


def _rows():
    return [{"example_id": "e", "group_id": "run/0/0", "sample_idx": i, "reward_info": "{}",
             **_episode(i, reward_scale=float(i)).rollout_fields()} for i in range(3)]


def test_episode_rows_store_the_mask_versions_and_turns_and_batch_them():
    table = to_table(_rows(), ROLLOUT_SCHEMA)
    row = table.to_pylist()[1]
    assert row["policy_mask"] == POLICY_MASK and row["turn_versions"] == [4, 5, 5]
    assert row["policy_version"] == 4  # the oldest turn's: the staleness bound uses it
    assert row["reward"] == pytest.approx(1.5)  # the episode's return
    batch = make_batch([table], max_seq_len=16)
    n = len(PROMPT)
    # Completion token k is predicted at position n - 1 + k: the loss mask is the policy mask, shifted.
    assert batch["loss_mask"][1, n - 1:n - 1 + len(COMPLETION)].tolist() == POLICY_MASK
    assert batch["loss_mask"][1].sum() == sum(POLICY_MASK) and batch["policy_versions"].tolist() == [4, 4, 4]
    single = {key: value for key, value in _rows()[0].items() if key not in ("policy_mask", "turn_versions", "episode")}
    assert to_table([single], ROLLOUT_SCHEMA).column("policy_mask").to_pylist() == [None]  # single-turn rows


def test_a_policy_mask_of_the_wrong_length_is_refused():
    row = {**_rows()[0], "policy_mask": POLICY_MASK[:-1]}
    with pytest.raises(ValueError, match="a policy_mask of 10 for 11 completion tokens"):
        make_batch([to_table([row], ROLLOUT_SCHEMA)], max_seq_len=16)


@pytest.mark.parametrize("preset", ["grpo", "dapo", "gspo"])
def test_observation_tokens_carry_no_gradient(preset):
    """The loss equals the loss over the policy tokens alone (observations kept as context), its
    gradient is the same, and the gradient at every observation position is exactly zero."""
    config = get_preset(preset)
    model = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    params = init_params(model, jax.random.key(0), jnp.float32)
    batch = make_batch([to_table(_rows(), ROLLOUT_SCHEMA)], max_seq_len=16)
    mask = jnp.asarray(batch["loss_mask"])
    advantages = compute_advantages(config, jnp.asarray(batch["rewards"]), mask, group_ids=jnp.asarray(batch["group_ids"]))
    behavior = jnp.asarray(batch["behavior_logprobs"])
    policy_rows, policy_cols = np.nonzero(batch["loss_mask"])
    per_row = len(policy_rows) // 3
    compact = lambda x: x[policy_rows, policy_cols].reshape(3, per_row)

    def loss_from(logprobs, which):
        old = jax.lax.stop_gradient(logprobs) - 0.05  # ratios away from 1: the clip and the weights matter
        ref = jax.lax.stop_gradient(logprobs) + 0.1  # a KL term in the loss, where the preset has one
        if which == "masked":
            return policy_loss(config, logprobs, old, advantages, mask, ref_logprobs=ref, behavior_logprobs=behavior)[0]
        return policy_loss(config, compact(logprobs), compact(old), compact(advantages), jnp.ones((3, per_row)),
                           ref_logprobs=compact(ref), behavior_logprobs=compact(behavior))[0]

    def loss(params, which):
        logprobs, _ = token_logprobs(params, model, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))
        return loss_from(logprobs, which)

    masked, grads = jax.value_and_grad(loss)(params, "masked")
    alone, grads_alone = jax.value_and_grad(loss)(params, "policy tokens only")
    np.testing.assert_allclose(masked, alone, rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_alone)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    logprobs, _ = token_logprobs(params, model, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))
    per_position = jax.grad(lambda lp: loss_from(lp, "masked"))(logprobs)
    observation = np.zeros_like(batch["loss_mask"], bool)
    n = len(PROMPT)
    observation[:, n - 1:n - 1 + len(COMPLETION)] = np.asarray(POLICY_MASK) == 0
    assert np.all(np.asarray(per_position)[observation] == 0.0)
    assert np.any(np.asarray(per_position)[batch["loss_mask"] > 0] != 0.0)
