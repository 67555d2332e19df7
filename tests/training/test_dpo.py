"""DPO: the loss, its gradients and metrics against plain numpy; the trainer's packed, micro-batched
gradient against a plain forward of each pair; LoRA's base as the reference; bad pairs."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.config import InputError
from rlax_core.models.config import toy_config
from rlax_core.models.lora_config import LoraConfig
from rlax_core.parallel import make_mesh
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.post_config import DpoConfig
from rlax_core.training.preference import PreferenceObjective, batch_loss, check_reference
from rlax_core.training.sft_data import Tokenized, preference_batch, tokenize_pair
from rlax_core.training.step import Trainer

MODEL = toy_config()


def numpy_dpo(pc, pr, rc, rr, lc, lr, *, loss, beta, ls, sft_coef):
    """The loss, d loss / d (pc, pr), and the metrics, by hand (the rewards: of the summed log-probs)."""
    cr, rj = beta * (pc - rc), beta * (pr - rr)
    if loss == "ipo":
        pc, pr, rc, rr = pc / lc, pr / lr, rc / lc, rr / lr
    z = (pc - pr) - (rc - rr)
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    if loss == "sigmoid":
        losses = -(1 - ls) * np.log(sig(beta * z)) - ls * np.log(sig(-beta * z))
        dz = (-(1 - ls) * sig(-beta * z) + ls * sig(beta * z)) * beta
    else:
        losses = (z - 1 / (2 * beta)) ** 2
        dz = 2 * (z - 1 / (2 * beta))
    n = len(z)
    d_pc, d_pr = dz / n, -dz / n
    if loss == "ipo":
        d_pc, d_pr = d_pc / lc, d_pr / lr
    total = losses.mean()
    if sft_coef:
        total += sft_coef * -(pc * (lc if loss == "ipo" else 1)).sum() / lc.sum()
        d_pc = d_pc - sft_coef / lc.sum()
    metrics = {"rewards_chosen": cr.mean(), "rewards_rejected": rj.mean(), "rewards_margin": (cr - rj).mean(),
               "rewards_accuracy": (cr > rj).mean()}
    return total, d_pc, d_pr, metrics


@pytest.mark.parametrize("loss,ls,sft_coef", [("sigmoid", 0.0, 0.0), ("sigmoid", 0.2, 0.5), ("ipo", 0.0, 0.0)])
def test_loss_gradients_and_metrics_equal_numpy(loss, ls, sft_coef):
    rng = np.random.default_rng(0)
    pairs = 5
    pc, pr, rc, rr = (-rng.random(pairs) * 20 for _ in range(4))
    lc, lr = rng.integers(3, 9, pairs).astype(float), rng.integers(3, 9, pairs).astype(float)
    # Samples in a shuffled order with two padding slots: chosen and rejected need not sit together.
    order = rng.permutation(2 * pairs)
    slots = 2 * pairs + 2
    policy, reference, lengths = np.zeros(slots), np.zeros(slots), np.zeros(slots)
    group, chosen, real = np.full(slots, -1), np.zeros(slots), np.zeros(slots)
    for k, sample in enumerate(order):
        pair, is_chosen = divmod(sample, 2)[0], sample % 2 == 0
        policy[k], reference[k] = (pc if is_chosen else pr)[pair], (rc if is_chosen else rr)[pair]
        lengths[k], group[k], chosen[k], real[k] = (lc if is_chosen else lr)[pair], pair, float(is_chosen), 1.0
    f = lambda s: batch_loss(s, jnp.asarray(reference), jnp.asarray(lengths), jnp.asarray(group),  # noqa: E731
                             jnp.asarray(chosen), jnp.asarray(real), loss=loss, beta=0.1, label_smoothing=ls,
                             sft_coef=sft_coef)
    (total, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(policy, jnp.float32))
    want, d_pc, d_pr, want_metrics = numpy_dpo(pc, pr, rc, rr, lc, lr, loss=loss, beta=0.1, ls=ls, sft_coef=sft_coef)
    np.testing.assert_allclose(float(total), want, rtol=1e-5)
    for name, value in want_metrics.items():
        np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-5, atol=1e-6)
    want_grad = np.zeros(slots)
    for k, sample in enumerate(order):
        pair = sample // 2
        want_grad[k] = d_pc[pair] if sample % 2 == 0 else d_pr[pair]
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
    assert int(metrics["num_pairs"]) == pairs


# ---------------------------------------------------------------- through the trainer, on the toy model


def toy_pairs(count=4, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        prompt = rng.integers(3, MODEL.vocab_size, int(rng.integers(3, 7)))
        pair = []
        for _ in range(2):
            completion = rng.integers(3, MODEL.vocab_size, int(rng.integers(2, 8)))
            pair.append(Tokenized(f"p{i}", np.r_[prompt, completion].astype(np.int32),
                                  np.r_[np.zeros(len(prompt)), np.ones(len(completion))].astype(np.float32)))
        out.append(tuple(pair))
    return out


def make_trainer(config=DpoConfig(beta=0.5, sft_coef=0.3), **overrides):
    trainer_config = TrainerConfig(max_seq_len=16, optimizer=OptimizerConfig(learning_rate=1e-3), **overrides)
    return Trainer(MODEL, PreferenceObjective(config), trainer_config,
                   make_mesh(trainer_config.mesh, jax.devices()[:1]))


def direct_loss(params, ref_params, pairs, config):
    """DPO from a plain forward of each sample in a row of its own."""
    samples = [s for pair in pairs for s in pair]
    tokens, attention = np.zeros((len(samples), 16), np.int32), np.zeros((len(samples), 16), np.int32)
    trained = np.zeros((len(samples), 15), np.float32)
    for row, sample in enumerate(samples):
        n = len(sample.tokens)
        tokens[row, :n], attention[row, :n], trained[row, :n - 1] = sample.tokens, 1, sample.trained[1:]

    def totals(p):
        return jnp.sum(token_logprobs(p, MODEL, tokens, attention)[0] * trained, axis=-1)

    return batch_loss(totals(params), totals(ref_params), jnp.asarray(trained.sum(axis=1)),
                      jnp.repeat(jnp.arange(len(pairs)), 2), jnp.tile(jnp.asarray([1.0, 0.0]), len(pairs)),
                      jnp.ones(len(samples)), loss=config.loss, beta=config.beta,
                      label_smoothing=config.label_smoothing, sft_coef=config.sft_coef)[0]


def test_packed_micro_batched_gradient_equals_a_plain_forward_of_each_pair():
    config = DpoConfig(beta=0.5, sft_coef=0.3)
    trainer = make_trainer(config, row_tokens=32, micro_batch_tokens=32)
    ref_params = trainer.init_state(seed=7).params
    state = trainer.init_state(seed=3)
    pairs = toy_pairs()
    batch = trainer.pack(preference_batch(pairs, max_seq_len=16))
    assert trainer.micro_batches_of(batch) > 1  # chosen and rejected may fall in different micro-batches
    loss, grads = trainer.gradients(state, batch, ref_params)
    want, want_grads = jax.jit(jax.value_and_grad(lambda p, r: direct_loss(p, r, pairs, config)))(
        state.params, ref_params)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
    # The reference's totals computed once and carried by the batch give the same loss.
    precomputed = make_trainer(DpoConfig(beta=0.5, sft_coef=0.3, reference="precomputed"))
    padded = preference_batch(pairs, max_seq_len=16)
    totals = np.asarray(precomputed.sequence_logprobs(padded, ref_params=None, state=precomputed.init_state(ref_params)))
    again = preference_batch(pairs, max_seq_len=16, reference_logprobs=totals[:len(pairs) * 2])
    loss_again, _ = precomputed.gradients(precomputed.init_state(state.params), again)
    np.testing.assert_allclose(float(loss_again), float(want), rtol=1e-5)


def test_with_lora_the_base_is_the_reference():
    trainer = make_trainer(DpoConfig(beta=0.1), lora=LoraConfig(rank=4, alpha=8.0))
    state = trainer.init_state(seed=0)  # fresh adapters: the policy is its base
    _, metrics = trainer.step(state, trainer.pack(preference_batch(toy_pairs(), max_seq_len=16)))
    np.testing.assert_allclose(float(metrics["loss"]), math.log(2), rtol=1e-5)
    assert float(metrics["rewards_margin"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["num_pairs"]) == 4


def test_more_than_one_update_per_batch_is_refused():
    with pytest.raises(ValueError, match="dpo: one optimizer update per batch"):
        make_trainer(mini_batches=2)


def test_bad_pairs_and_references_get_one_line():
    chat = [{"role": "user", "content": "Pick one."}]
    chosen = json.dumps(chat + [{"role": "assistant", "content": "A"}])
    rejected = json.dumps([{"role": "user", "content": "Pick two."}, {"role": "assistant", "content": "B"}])
    with pytest.raises(InputError, match="pair q1: chosen and rejected have different prompts") as error:
        tokenize_pair({"id": "q1", "prompt": "", "chosen": chosen, "rejected": rejected}, tokenizer=None)
    assert "\n" not in str(error.value)
    with pytest.raises(InputError, match="reference .* is not the policy's architecture: hidden_size 32, not 64"):
        check_reference(MODEL, toy_config(hidden_size=32), "ref/")
