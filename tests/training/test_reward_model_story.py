"""A Bradley-Terry reward model learns the story task's verifier from preference pairs: for one prompt,
a stories260K completion that passes the verifier is chosen over one that fails. Held-out pairs (of
prompts the reward model never saw) are ordered right at least 85% of the time: by the plain loss,
and by ``rlax rm`` (the trainer's job), whose model the ``reward_model`` term then reads."""

import collections
import json
import random
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models import from_pretrained
from rlax_core.models.tokenizer import load_tokenizer
from rlax_core.tasks.prompts import prompt_ids
from rlax_core.tasks.story import score_story, story_examples
from rlax_core.training.reward_model import init_reward_params, pair_batch, pair_loss, reward_model_config

ROOT = Path(__file__).resolve().parents[2]
STORIES = ROOT / "pipelines" / "assets" / "stories260K"
REJECTED_PER_CHOSEN = 3


def story_preference_pairs(policy, tokenizer, prompts: int, samples: int) -> list[dict]:
    """Pairs of one prompt's completions: one that passes the story verifier, one that fails."""
    examples = story_examples("train", prompts, seed=0)
    engine = Engine(EngineConfig(num_slots=64, num_pages=320, max_prompt_len=64, max_new_tokens=64,
                                 prefill_buckets=(64,), max_prefill_batch=16, attention_impl="reference"),
                    policy.config, policy.params)
    newline = tokenizer.encode("\n")[-1]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, samples_per_prompt=samples,
                              stop_token_ids=(*policy.config.eos_token_ids, newline))
    completions = engine.generate([Request(tuple(prompt_ids(e, tokenizer)), sampling, prompt_id=i, seed=0)
                                   for i, e in enumerate(examples)])
    passed, failed = collections.defaultdict(list), collections.defaultdict(list)
    for completion in completions:
        text = tokenizer.decode(completion.completion_ids, skip_special_tokens=True)
        _, info = score_story(text, completion.finish_reason)
        (passed if info["pass"] else failed)[completion.prompt_id].append(text)
    return [{"id": examples[i]["id"], "prompt": examples[i]["prompt"], "chosen": chosen, "rejected": rejected}
            for i in sorted(passed) for chosen in passed[i] for rejected in failed[i][:REJECTED_PER_CHOSEN]]


@pytest.fixture(scope="module")
def story_pairs():
    """(training pairs, held-out pairs): the held-out ones of prompts no training pair has."""
    policy = from_pretrained(STORIES / "stories260K.bin")
    tokenizer = load_tokenizer(STORIES / "tok512.model")
    pairs = story_preference_pairs(policy, tokenizer, prompts=48, samples=16)
    prompts = sorted({pair["id"] for pair in pairs})
    random.Random(0).shuffle(prompts)
    held_out_prompts = set(prompts[:len(prompts) // 3])
    return ([pair for pair in pairs if pair["id"] not in held_out_prompts],
            [pair for pair in pairs if pair["id"] in held_out_prompts])


@pytest.mark.slow
@pytest.mark.long
def test_held_out_pair_accuracy_reaches_085_on_the_story_task(story_pairs):
    policy = from_pretrained(STORIES / "stories260K.bin")
    tokenizer = load_tokenizer(STORIES / "tok512.model")
    train, held_out_pairs = story_pairs
    train = list(train)
    held_out = pair_batch(held_out_pairs, tokenizer, 128)
    assert len(train) >= 32 and len(held_out["tokens"]) >= 20, "too few passing completions to make pairs"

    config = reward_model_config(policy.config)
    params = init_reward_params(policy.params)
    optimizer = optax.adam(3e-3)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, batch):
        (_, metrics), grads = jax.value_and_grad(pair_loss, has_aux=True)(params, config, batch, 0.01)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state, metrics

    order = random.Random(1)
    for _ in range(2):
        order.shuffle(train)
        for start in range(0, len(train) - 15, 16):
            params, state, _ = step(params, state, pair_batch(train[start:start + 16], tokenizer, 128))
    _, metrics = pair_loss(params, config, held_out)
    assert float(metrics["pair_accuracy"]) >= 0.85
    assert float(metrics["margin"]) > 0


def write_pairs(path, pairs):
    # Record ids are the pairs' own (a prompt has several pairs): PreferencePair ids are unique.
    path.write_text("".join(json.dumps({**pair, "id": f"{pair['id']}-{i}"}) + "\n" for i, pair in enumerate(pairs)))
    return str(path)


@pytest.mark.slow
@pytest.mark.long  # rlax rm end to end: the engine's pairs, 2 epochs of training, the held-out pass
def test_rlax_rm_reaches_085_held_out_pair_accuracy_and_the_reward_term_reads_its_model(story_pairs, tmp_path):
    from pipelines.config import load_run_config
    from pipelines.rm import reward_model
    from rlax_core.config import from_dict
    from rlax_core.rewards import RewardConfig, Rewarder, Sample
    from rlax_core.training.reward_model import read_score_stats
    from rlax_core.utils.metrics import read_metrics

    train, held_out = story_pairs
    steps = 2 * len(train) // 16
    config = load_run_config(str(ROOT / "configs/quickstart.yaml"), [
        f"run.output_dir={tmp_path / 'rm'}", f"rm.data={write_pairs(tmp_path / 'train.jsonl', train)}",
        f"rm.validation_data={write_pairs(tmp_path / 'held.jsonl', held_out)}", "rm.pairs_per_step=16",
        f"rm.eval_every={steps}", "rm.center_coefficient=0.01", f"trainer.total_steps={steps}",
        f"trainer.checkpoint_every={steps}", "trainer.async_checkpointing=false", "trainer.optimizer.learning_rate=3e-3"])
    result = reward_model(config)
    assert result.step == steps and not result.preempted
    rows = read_metrics(tmp_path / "rm/metrics")
    accuracy = {row["step"]: row["train/heldout_pair_accuracy"] for row in rows if "train/heldout_pair_accuracy" in row}
    assert sorted(accuracy) == [0, steps]
    assert accuracy[steps] >= 0.85, accuracy
    trained = [row for row in rows if "train/loss" in row]
    assert all({"train/pair_accuracy", "train/margin", "train/score_mean", "train/score_std"} <= set(row)
               for row in trained)
    folder = tmp_path / f"rm/hf/step_{steps:08d}"
    stats = read_score_stats(folder)
    assert stats is not None and stats["std"] > 0
    # The reward term reads the exported model and its statistics, and orders the held-out pairs as the job did.
    rewards = from_dict(RewardConfig, {"terms": {"reward_model": 1.0}, "reward_model": {"path": str(folder)}})
    with Rewarder(rewards) as rewarder:
        results = rewarder.score_many([Sample({"id": pair["id"], "task": "story", "prompt": pair["prompt"]}, pair[side])
                                       for pair in held_out for side in ("chosen", "rejected")])
    raw = np.asarray([info["terms"]["reward_model"]["raw_score"] for _, info in results]).reshape(-1, 2)
    assert float(np.mean(raw[:, 0] > raw[:, 1])) == pytest.approx(accuracy[steps], abs=0.02)
    np.testing.assert_allclose([reward for reward, _ in results[:2]], (raw[0] - stats["mean"]) / stats["std"],
                               rtol=1e-4, atol=1e-4)
