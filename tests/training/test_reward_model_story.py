"""A Bradley-Terry reward model learns the story task's verifier from preference pairs: for one prompt,
a stories260K completion that passes the verifier is chosen over one that fails. Held-out pairs (of
prompts the reward model never saw) are ordered right at least 85% of the time."""

import collections
import random
from pathlib import Path

import jax
import optax
import pytest

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models import from_pretrained
from rlax_core.models.tokenizer import load_tokenizer
from rlax_core.tasks.prompts import prompt_ids
from rlax_core.tasks.story import score_story, story_examples
from rlax_core.training.reward_model import init_reward_params, pair_batch, pair_loss, reward_model_config

STORIES = Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K"
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


@pytest.mark.slow
def test_held_out_pair_accuracy_reaches_085_on_the_story_task():
    policy = from_pretrained(STORIES / "stories260K.bin")
    tokenizer = load_tokenizer(STORIES / "tok512.model")
    pairs = story_preference_pairs(policy, tokenizer, prompts=48, samples=16)
    prompts = sorted({pair["id"] for pair in pairs})
    random.Random(0).shuffle(prompts)
    held_out_prompts = set(prompts[:len(prompts) // 3])
    train = [pair for pair in pairs if pair["id"] not in held_out_prompts]
    held_out = pair_batch([pair for pair in pairs if pair["id"] in held_out_prompts], tokenizer, 128)
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
