"""``rlax rm``'s machinery: the trainer with the rm objective gives the gradient of the plain
Bradley-Terry loss (packed, micro-batched, pairs split across micro-batches), LoRA trains the score
head beside its adapters, and the job resumes exactly and writes a model the reward term reads."""


import jax
import numpy as np
import pytest

from rlax_core.config import InputError
from rlax_core.models import init_params, toy_config
from rlax_core.models.lora_config import LoraConfig
from rlax_core.parallel import make_mesh
from rlax_core.training.bradley_terry import BradleyTerryObjective
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.reward_model import (init_reward_params, pair_batch, pair_loss, reward_model_config,
                                             reward_samples)
from rlax_core.training.sft_data import preference_batch
from rlax_core.training.step import Trainer

POLICY = toy_config(tie_word_embeddings=False)
RM = reward_model_config(POLICY)


class _Bytes:
    """A byte tokenizer inside the toy vocabulary, with BOS 1."""

    def encode(self, text, add_bos=False):
        return ([1] if add_bos else []) + [3 + b % 250 for b in text.encode()]


PAIRS = [{"id": f"p{i}", "prompt": p, "chosen": c, "rejected": r, "margin": m}
         for i, (p, c, r, m) in enumerate([("Once", " a cat", " no", 0.5), ("Hi", " yes it is", " x", 0.0),
                                           ("Say", " ok", " not at all", 1.0), ("Go", " far away", " stop", 0.0),
                                           ("Why", " because", " no idea at all", 0.25)])]


def rm_params(seed=0):
    params = init_reward_params(init_params(POLICY, jax.random.key(seed)))
    params["score"]["kernel"] = jax.random.normal(jax.random.key(seed + 1), params["score"]["kernel"].shape) * 0.3
    return params


def make_trainer(objective, **overrides):
    config = TrainerConfig(max_seq_len=24, optimizer=OptimizerConfig(learning_rate=1e-3), **overrides)
    return Trainer(RM, objective, config, make_mesh(config.mesh, jax.devices()[:1]))


def rm_batch(pairs, trainer, margins=True):
    batch = preference_batch([reward_samples(p, _Bytes()) for p in pairs], max_seq_len=24,
                             row_multiple=trainer.row_multiple)
    if margins:
        batch["margins"] = np.zeros(len(batch["sample_mask"]), np.float32)
        batch["margins"][0:2 * len(pairs):2] = [p["margin"] for p in pairs]
    return batch


def test_packed_micro_batched_gradient_equals_the_plain_bradley_terry_gradient(center=0.05):
    params = rm_params()
    objective = BradleyTerryObjective(margin=0.1, center_coefficient=center)
    trainer = make_trainer(objective, row_tokens=32, micro_batch_tokens=32)
    batch = trainer.pack(rm_batch(PAIRS, trainer))
    assert trainer.micro_batches_of(batch) > 1  # a pair's sides may fall in different micro-batches
    loss, grads = trainer.gradients(trainer.init_state(params), batch)

    plain = pair_batch(PAIRS, _Bytes(), 24)
    plain["margin"] = plain["margin"] + 0.1
    want, want_grads = jax.jit(jax.value_and_grad(lambda p: pair_loss(p, RM, plain, center)[0]))(params)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=2e-6)


def test_metrics_are_the_pairs_and_a_step_lowers_the_loss():
    trainer = make_trainer(BradleyTerryObjective())
    state = trainer.init_state(rm_params())
    batch = rm_batch(PAIRS, trainer, margins=False)
    _, want = pair_loss(rm_params(), RM, pair_batch(PAIRS, _Bytes(), 24))
    losses = []
    for step in range(2):
        state, metrics = trainer.step(state, batch)
        if step == 0:
            for name in ("pair_accuracy", "margin", "score_mean", "score_std"):
                assert float(metrics[name]) == pytest.approx(float(want[name]), abs=1e-5), name
            assert float(metrics["num_pairs"]) == len(PAIRS)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0]


def test_with_lora_the_score_head_trains_beside_the_adapters():
    trainer = make_trainer(BradleyTerryObjective(), lora=LoraConfig(rank=4, alpha=8.0))
    state = trainer.init_state(init_reward_params(init_params(POLICY, jax.random.key(0))))
    assert set(state.params) == {"layers", "score"}
    batch = rm_batch(PAIRS, trainer, margins=False)
    state, metrics = trainer.step(state, batch)
    assert float(metrics["loss"]) == pytest.approx(np.log(2), rel=1e-5)  # a zero head: every margin 0
    assert float(np.abs(np.asarray(state.params["score"]["kernel"])).max()) > 0
    state, metrics = trainer.step(state, batch)
    assert float(metrics["loss"]) < np.log(2)
    complete = trainer.policy_params(state.params)
    np.testing.assert_array_equal(np.asarray(complete["score"]["kernel"]), np.asarray(state.params["score"]["kernel"]))
    with pytest.raises(ValueError, match="^rm: trainer.lora.dropout must be 0"):
        make_trainer(BradleyTerryObjective(), lora=LoraConfig(rank=4, alpha=8.0, dropout=0.1))


def test_a_pair_with_an_empty_side_is_refused_in_one_line():
    with pytest.raises(InputError, match=r"^preference pair 'p1': empty 'chosen'") as caught:
        reward_samples({"id": "p1", "prompt": "Once", "chosen": "", "rejected": " no"}, _Bytes())
    assert "\n" not in str(caught.value)
