"""SFT's loss masks: which tokens are trained, for prompts and chats, and that packing keeps them exactly.

What users of other trainers trip over (TRL's ``assistant_only_loss`` ignored under packing, trl
3728; torchforge's packed SFT masks, 546) is tested against a plain forward of each conversation
alone, so a mask dropped or shifted under packing fails here.
"""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from rlax_core.config import InputError
from rlax_core.models.config import toy_config
from rlax_core.models.tokenizer import load_tokenizer
from rlax_core.parallel import make_mesh
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.sft_data import (LengthCounts, Tokenized, fit_length, supervised_batch, tokenize_example)
from rlax_core.training.step import Trainer
from rlax_core.training.supervised import SupervisedObjective

ROOT = Path(__file__).resolve().parents[2]
MODEL = toy_config()
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green, then."}]


@pytest.fixture(scope="module")
def stories_tokenizer():
    return load_tokenizer(ROOT / "pipelines/assets/stories260K/tok512.model")


@pytest.fixture(scope="module")
def chat_tokenizer(data_dir):
    return load_tokenizer(data_dir / "tokenizers/qwen2")


def trained_text(sample, tokenizer):
    """The trained tokens' text, span by span (a span: a run of trained tokens)."""
    spans, current = [], []
    for token, trained in zip(sample.tokens, sample.trained):
        if trained:
            current.append(int(token))
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    return spans + ([tokenizer.decode(current)] if current else [])


def test_prompt_and_completion_trains_the_completion_and_eos_only(stories_tokenizer):
    tok = stories_tokenizer
    sample = tokenize_example({"id": "a", "prompt": "Once upon a time", "completion": " there was a cat."}, tok)
    prompt = tok.encode("Once upon a time", add_bos=True)
    assert sample.tokens[:len(prompt)].tolist() == prompt and not sample.trained[:len(prompt)].any()
    assert sample.trained[len(prompt):].all() and sample.tokens[-1] == tok.eos_id
    assert trained_text(sample, tok) == ["there was a cat."]
    # The batch's mask is the trained flags shifted by one: position t predicts token t + 1.
    batch = supervised_batch([sample], max_seq_len=32)
    assert batch["loss_mask"][0].nonzero()[0].tolist() == list(range(len(prompt) - 1, len(sample.tokens) - 1))
    whole = tokenize_example({"id": "a", "prompt": "Once upon a time", "completion": " there"}, tok, "sequence")
    assert whole.trained[1:].all()


def test_chat_trains_every_assistant_turn_or_the_last_and_never_the_user(chat_tokenizer):
    tok = chat_tokenizer
    every = tokenize_example({"id": "c", "messages": json.dumps(CHAT)}, tok, "assistant")
    assert trained_text(every, tok) == ["Blue.<|im_end|>\n", "Green, then.<|im_end|>\n"]
    last = tokenize_example({"id": "c", "messages": json.dumps(CHAT)}, tok, "completion")
    assert trained_text(last, tok) == ["Green, then.<|im_end|>\n"]
    # The pieces add up to the template's rendering of the whole chat.
    assert tok.decode(every.tokens.tolist()) == tok.apply_chat_template(CHAT)


def test_bad_records_get_one_line(chat_tokenizer, stories_tokenizer):
    with pytest.raises(InputError, match="record r1: an SFT example needs a completion") as error:
        tokenize_example({"id": "r1", "prompt": "Once"}, stories_tokenizer)
    assert "\n" not in str(error.value)
    with pytest.raises(InputError, match="record r2: a chat without an assistant turn"):
        tokenize_example({"id": "r2", "messages": json.dumps(CHAT[:2])}, chat_tokenizer)
    with pytest.raises(InputError, match="record r3: chat messages need a tokenizer with a chat template"):
        tokenize_example({"id": "r3", "messages": json.dumps(CHAT)}, stories_tokenizer)


def test_over_length_examples_are_refused_truncated_or_windowed_and_counted():
    sample = Tokenized("long", np.arange(3, 23, dtype=np.int32), np.r_[np.zeros(4), np.ones(16)].astype(np.float32))
    counts = LengthCounts()
    assert fit_length([sample], 8, "refuse", counts=counts) == [] and counts.refused == 1
    truncated = fit_length([sample], 8, "truncate", counts=counts)
    assert counts.truncated == 1 and truncated[0].tokens.tolist() == list(range(3, 11))
    for overlap in (0, 3):
        windows = fit_length([sample], 8, "window", overlap=overlap, counts=counts)
        assert all(len(w.tokens) <= 8 for w in windows)
        # Every trained target of the example is trained exactly once over its windows.
        targets = [int(t) for w in windows for t, on in zip(w.tokens[1:], w.trained[1:]) if on]
        assert targets == sample.tokens[sample.trained > 0].tolist()
    assert counts.windowed == 2 and counts.windows >= 5


# ---------------------------------------------------------------- packed against padded, on the toy model


def conversations(count=6, seed=0):
    """Multi-turn-shaped samples: alternating context and trained spans of random lengths."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        spans = rng.integers(2, 6, size=int(rng.integers(2, 5)))
        trained = np.concatenate([np.full(n, k % 2, np.float32) for k, n in enumerate(spans)])
        out.append(Tokenized(f"s{i}", rng.integers(3, MODEL.vocab_size, len(trained)).astype(np.int32), trained))
    return out


def make_trainer(aggregation="token_mean", **overrides):
    config = TrainerConfig(max_seq_len=24, optimizer=OptimizerConfig(learning_rate=1e-3), **overrides)
    return Trainer(MODEL, SupervisedObjective(aggregation), config, make_mesh(config.mesh, jax.devices()[:1]))


@pytest.fixture(scope="module")
def params():
    return make_trainer().init_state(seed=3).params


@jax.jit
def plain_logprobs(params, tokens, attention_mask):
    return token_logprobs(params, MODEL, tokens, attention_mask)[0]


def reference_loss(params, samples, aggregation):
    """Each conversation in a row of its own through a plain forward: the NLL of its trained targets."""
    tokens, attention = np.zeros((len(samples), 24), np.int32), np.zeros((len(samples), 24), np.int32)
    for row, sample in enumerate(samples):
        tokens[row, :len(sample.tokens)], attention[row, :len(sample.tokens)] = sample.tokens, 1
    logprobs = np.asarray(plain_logprobs(params, tokens, attention), np.float64)
    per_sample = []
    for row, sample in enumerate(samples):
        mask = sample.trained[1:]
        nll = -(logprobs[row, :len(mask)] * mask).sum()
        per_sample.append(nll if aggregation == "token_mean" else nll / mask.sum())
    total = sum(per_sample)
    return total / (sum(s.trained[1:].sum() for s in samples) if aggregation == "token_mean" else len(samples))


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_packed_and_padded_batches_give_the_same_loss_and_gradients(params, aggregation):
    samples = conversations()
    padded_trainer = make_trainer(aggregation)
    packed_trainer = make_trainer(aggregation, row_tokens=64, micro_batch_tokens=64)
    padded = supervised_batch(samples, max_seq_len=24)
    packed = packed_trainer.pack(padded)
    assert packed["tokens"].shape[0] < len(samples) and packed["segment_ids"].max() >= 3  # several per row
    loss_padded, grads_padded = padded_trainer.gradients(padded_trainer.init_state(params), padded)
    loss_packed, grads_packed = packed_trainer.gradients(packed_trainer.init_state(params), packed)
    np.testing.assert_allclose(float(loss_packed), float(loss_padded), atol=1e-6, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_packed), jax.tree.leaves(grads_padded)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    np.testing.assert_allclose(float(loss_packed), reference_loss(params, samples, aggregation), rtol=1e-5)


def test_a_mask_dropped_under_packing_would_change_the_loss(params):
    """The equality above is not vacuous: the same rows with every token trained lose differently,
    so a packer that dropped the mask (or trained the context) fails the test above."""
    samples = conversations()
    everything = [Tokenized(s.id, s.tokens, np.ones_like(s.trained)) for s in samples]
    trainer = make_trainer(row_tokens=64, micro_batch_tokens=64)
    loss, _ = trainer.gradients(trainer.init_state(params), trainer.pack(supervised_batch(samples, max_seq_len=24)))
    dropped = reference_loss(params, everything, "token_mean")
    assert abs(float(loss) - dropped) > 1e-3
    np.testing.assert_allclose(float(loss), reference_loss(params, samples, "token_mean"), rtol=1e-5)
