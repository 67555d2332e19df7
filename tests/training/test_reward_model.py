"""The Bradley-Terry reward model: score head on the last real token, the pair loss against numpy,
learning a preference, and its checkpoint in Hugging Face's sequence-classification layout."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlax_core.config import ConfigError, InputError
from rlax_core.models import from_pretrained, init_params, save_pretrained, toy_config
from rlax_core.models.checkpoint import Model
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import hidden_states
from rlax_core.training.reward_model import (bradley_terry_loss, init_reward_params, pair_batch, pair_loss,
                                             read_score_stats, reward_logical_axes, reward_model_config,
                                             sequence_scores, write_score_stats)

POLICY = toy_config(tie_word_embeddings=False)
RM = reward_model_config(POLICY)
# Jitted once per shape: the transformer run op by op is what made these tests slow.
scores_of = jax.jit(sequence_scores, static_argnames="config")
hidden_of = jax.jit(hidden_states, static_argnames="config")


@pytest.fixture(scope="module")
def policy_params():
    return init_params(POLICY, jax.random.key(0))


@pytest.fixture(scope="module")
def reward_params(policy_params):
    params = init_reward_params(policy_params)
    params["score"]["kernel"] = jax.random.normal(jax.random.key(1), params["score"]["kernel"].shape) * 0.3
    return params


def test_the_score_is_the_head_on_the_last_real_token_whatever_the_padding(reward_params):
    rng = np.random.default_rng(0)
    ids = rng.integers(3, POLICY.vocab_size, (3, 10))
    mask = np.array([[1] * 10, [1] * 7 + [0] * 3, [1] * 2 + [0] * 8])
    scores = np.asarray(scores_of(reward_params, RM, ids, mask))
    alone = {k: v for k, v in reward_params.items() if k != "score"}
    for row, length in enumerate(mask.sum(1)):
        hidden = np.asarray(hidden_of(alone, RM, ids[row:row + 1, :length]))[0, -1]
        np.testing.assert_allclose(scores[row], hidden @ np.asarray(reward_params["score"]["kernel"]), atol=1e-5)
    assert "lm_head" not in reward_params
    assert jax.tree.structure(reward_logical_axes(RM), is_leaf=lambda x: isinstance(x, tuple)) == \
        jax.tree.structure(reward_params)


def test_a_new_reward_model_scores_every_pair_at_zero(policy_params):
    params = init_reward_params(policy_params)
    ids = np.ones((3, 10), np.int32)  # the shape the test above compiled
    np.testing.assert_array_equal(scores_of(params, RM, ids, np.ones_like(ids)), 0.0)


def _numpy_loss(chosen, rejected, margin, center):
    difference = chosen - rejected - (0.0 if margin is None else margin)
    loss = np.mean(np.log1p(np.exp(-difference)))  # -log sigmoid(x)
    return loss + center * np.mean((chosen + rejected) ** 2)


@pytest.mark.parametrize("margin, center", [(None, 0.0), (np.array([0.5, 0.0, 1.0, 2.0]), 0.0), (None, 0.01)])
def test_bradley_terry_loss_and_metrics_against_numpy(margin, center):
    chosen = np.array([1.0, -0.5, 2.0, 0.1], np.float32)
    rejected = np.array([0.0, 0.5, -1.0, 0.3], np.float32)
    loss, metrics = bradley_terry_loss(chosen, rejected, margin, center)
    np.testing.assert_allclose(loss, _numpy_loss(chosen, rejected, margin, center), rtol=1e-5)
    assert float(metrics["pair_accuracy"]) == 0.5  # pairs 0 and 2 ordered right
    np.testing.assert_allclose(metrics["margin"], np.mean(chosen - rejected), rtol=1e-6)
    both = np.concatenate([chosen, rejected])
    np.testing.assert_allclose([metrics["score_mean"], metrics["score_std"]], [both.mean(), both.std()], rtol=1e-6)


class _Bytes:
    """Bytes as token ids (3..258 folded into the toy vocabulary): a tokenizer with no files."""

    def encode(self, text, add_bos=False):
        return ([1] if add_bos else []) + [3 + b % 250 for b in text.encode()]


def test_a_pair_with_an_empty_side_is_refused_in_one_line():
    pairs = [{"id": "p1", "prompt": "Once", "chosen": " upon a time", "rejected": "   "}]
    with pytest.raises(InputError, match=r"^preference pair 'p1': empty 'rejected'") as caught:
        pair_batch(pairs, _Bytes(), 16)
    assert "\n" not in str(caught.value)


def test_pairs_become_chosen_rows_then_rejected_rows():
    pairs = [{"id": "a", "prompt": "Hi", "chosen": " yes", "rejected": " no", "margin": 1.0},
             {"id": "b", "prompt": "Yo", "chosen": " ok", "rejected": " nope"}]
    batch = pair_batch(pairs, _Bytes(), 8)
    assert batch["tokens"].shape == (4, 8)
    assert batch["attention_mask"].sum(1).tolist() == [7, 6, 6, 8]  # BOS + bytes
    assert batch["margin"].tolist() == [1.0, 0.0]


def test_bradley_terry_learns_a_preference():
    # Chosen completions say "good", rejected ones "bad": held-out pairs are ordered after a few steps.
    words = ["the cat", "a dog", "my hat", "one sun", "red car", "big tree", "old man", "sea"]
    pairs = [{"id": str(i), "prompt": f"{w}:", "chosen": " good", "rejected": " bad"} for i, w in enumerate(words)]
    train, held_out = pair_batch(pairs[:6], _Bytes(), 12), pair_batch(pairs[6:], _Bytes(), 12)
    small = toy_config(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    config = reward_model_config(small)
    params = init_reward_params(init_params(small, jax.random.key(0)))
    optimizer = optax.adam(1e-2)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state):
        (loss, metrics), grads = jax.value_and_grad(pair_loss, has_aux=True)(params, config, train, 0.01)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    first = None
    for _ in range(15):
        params, state, loss = step(params, state)
        first = float(loss) if first is None else first
    _, metrics = jax.jit(pair_loss, static_argnames="config")(params, config, held_out)
    assert float(loss) < first < 0.7
    assert float(metrics["pair_accuracy"]) == 1.0


def test_checkpoint_round_trip_in_the_sequence_classification_layout(tmp_path, reward_params):
    written = save_pretrained(Model(RM, reward_params), tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["Qwen2ForSequenceClassification"] and hf["id2label"] == {"0": "LABEL_0"}
    from safetensors import safe_open

    with safe_open(tmp_path / written[1], framework="numpy") as handle:
        assert handle.get_tensor("score.weight").shape == (1, POLICY.hidden_size)
        assert "lm_head.weight" not in handle.keys()
    loaded = from_pretrained(tmp_path)
    assert loaded.config == RM
    jax.tree.map(np.testing.assert_array_equal, loaded.params, reward_params)
    write_score_stats(tmp_path, {"score_mean": 0.25, "score_std": 2.0})
    assert read_score_stats(tmp_path) == {"mean": 0.25, "std": 2.0}


@pytest.mark.parametrize("labels", [{"0": "NEG", "1": "POS"}, None])
def test_a_head_with_more_than_one_label_is_refused_in_one_line(labels):
    hf = RM.to_hf()
    hf.pop("id2label"), hf.pop("label2id")
    if labels:
        hf["id2label"] = labels
    with pytest.raises(ConfigError, match="a classification head with 2 labels; a reward model's score head "
                                          "has exactly one") as caught:
        ModelConfig.from_hf(hf)
    assert "\n" not in str(caught.value)


def test_only_the_dense_families_have_a_score_head():
    with pytest.raises(ConfigError, match="score_head"):
        toy_config(architecture="mixtral", score_head=True)
    assert RM.num_params == POLICY.num_params - POLICY.vocab_size * POLICY.hidden_size + POLICY.hidden_size
