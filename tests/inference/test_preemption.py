"""Pages on demand: a pool small enough to preempt many times gives a big pool's tokens, and the
samples of a prompt hold its full pages once (``pages``, ``engine``)."""

import dataclasses

import numpy as np
import pytest

from rlax_core.config import ConfigError
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models.lora_config import LoraConfig
from tests.inference.test_adapter_engine import random_adapters
from tests.support.compiles import COMPILES
from tests.support.tolerances import decoder_logprob_bound

# Budgets of 10 pages; the small pool holds 14 pages, under two sequences' budgets.
BIG = EngineConfig(num_slots=4, page_size=8, num_pages=64, max_prompt_len=32, max_new_tokens=48,
                   prefill_buckets=(8, 16, 32), decode_steps_per_call=8, attention_impl="window", admission="reserve")
SMALL = dataclasses.replace(BIG, num_pages=15, admission="on_demand")

TEXTS = ["Once upon a time", "The dog ran to the park and saw a big red ball", "Tom", "Lily liked to play"]


def _requests(tokenizer):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=40, samples_per_prompt=3)
    stopped = SamplingParams(temperature=0.8, max_new_tokens=48, samples_per_prompt=2, stop_strings=(" the",),
                             ignore_eos=True)
    return [Request(tokenizer.encode(text, add_bos=True), sampling, prompt_id=f"{name}-{i}", seed=11)
            for i, text in enumerate(TEXTS) for name, sampling in (("g", greedy), ("s", seeded), ("x", stopped))]


def _assert_same(ours, theirs, model_config):
    """Every token exactly; log-probs within rounding (a preempted sequence's prompt and tokens so far
    are prefilled again, which adds in another order than the decode steps did)."""
    assert [(c.prompt_id, c.sample_index, c.completion_ids, c.finish_reason) for c in ours] == \
        [(c.prompt_id, c.sample_index, c.completion_ids, c.finish_reason) for c in theirs]
    for a, b in zip(ours, theirs):
        bound = decoder_logprob_bound(model_config, context=len(a.prompt_ids) + len(a.completion_ids))
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=bound, atol=bound)


@pytest.mark.slow  # two engines' programs for three sampling modes: minutes on the shared 2-core machine
def test_a_pool_that_preempts_often_gives_a_big_pools_tokens(stories):
    model, tokenizer = stories
    requests = _requests(tokenizer)
    big = Engine(BIG, model.config, model.params, detokenize=tokenizer.decode)
    small = Engine(SMALL, model.config, model.params, detokenize=tokenizer.decode)
    expected, got = big.generate(requests), small.generate(requests)
    _assert_same(got, expected, model.config)
    assert any(c.finish_reason == "stop" for c in got) and any(c.finish_reason == "length" for c in got)
    assert small.stats["preemptions"] >= 10 and big.stats["preemptions"] == 0
    assert small.stats["peak_pages_in_use"] <= SMALL.num_pages - 1
    assert small.pages.num_free == SMALL.num_pages - 1  # every page came back, each once


@pytest.mark.slow  # two batch-invariant engines' programs for three sampling modes
def test_swapped_preemptions_give_a_big_pools_tokens_and_log_probs_bit_for_bit(stories):
    """Pages swapped to host memory and back instead of recomputed, and prompts prefilled alike
    whatever was admitted with them (``batch_invariant``): no rounding left to bound."""
    model, tokenizer = stories
    requests = _requests(tokenizer)
    invariant = dataclasses.replace(BIG, batch_invariant=True)
    big = Engine(invariant, model.config, model.params, detokenize=tokenizer.decode)
    small = Engine(dataclasses.replace(invariant, num_pages=15, admission="on_demand", preemption="swap"),
                   model.config, model.params, detokenize=tokenizer.decode)
    expected, got = big.generate(requests), small.generate(requests)
    assert small.stats["preemptions"] >= 10 and small.stats["extended_tokens"] == 0  # nothing recomputed
    assert [(c.prompt_id, c.sample_index, c.completion_ids, c.logprobs, c.finish_reason) for c in got] == \
        [(c.prompt_id, c.sample_index, c.completion_ids, c.logprobs, c.finish_reason) for c in expected]


@pytest.mark.slow
def test_a_preempted_episode_and_an_adapter_version_give_a_big_pools_tokens(stories):
    model, tokenizer = stories
    lora = LoraConfig(rank=4, alpha=8.0)
    adapters = random_adapters(model.config, lora)
    turn = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True)
    runs = []
    for config in (BIG, SMALL):
        engine = Engine(config, model.config, model.params)
        engine.update_adapters(adapters, lora, version=1)
        first = engine.generate([Request(tokenizer.encode(text, add_bos=True), turn, prompt_id=i, seed=3,
                                         episode_tokens=80) for i, text in enumerate(TEXTS)])
        turns = list(first)
        for round_index in range(2):  # every episode continues twice with an observation
            for completion in turns[-len(TEXTS):]:
                engine.continue_episode(completion.episode, [5 + round_index, 9], turn)
            done = []
            while engine.has_unfinished():
                done += engine.step()
            turns += [c for _, c in sorted(done, key=lambda pair: pair[0])]
        runs.append((turns, engine.stats["preemptions"]))
    (expected, _), (got, preemptions) = runs
    _assert_same(got, expected, model.config)
    assert preemptions >= 2
    assert all(c.weight_version == 1 for c in got)


def test_the_samples_of_a_long_prompt_hold_its_full_pages_once(stories):
    model, _ = stories
    samples, prompt = 4, list(range(3, 33))  # 29 cached tokens: 3 full pages of 8 and a partial one
    config = dataclasses.replace(BIG, num_pages=64)
    for admission in ("on_demand", "reserve"):
        engine = Engine(dataclasses.replace(config, admission=admission), model.config, model.params)
        engine.generate([Request(prompt, SamplingParams(temperature=1.0, max_new_tokens=4,
                                                        samples_per_prompt=samples))])
        own = engine.pages.pages_for(len(prompt) + 4) - 3  # the partial page, copied, and what follows it
        assert engine.stats["peak_pages_in_use"] == 3 + samples * own, admission
        assert engine.stats["shared_prefills"] == samples - 1


def test_a_request_that_cannot_fit_the_pool_is_refused_by_config():
    with pytest.raises(ConfigError, match="num_pages"):
        dataclasses.replace(BIG, num_pages=10)  # the sink and 9 pages: one 80-token budget needs 10
    with pytest.raises(ConfigError, match="admission.*on_demand or reserve"):
        dataclasses.replace(BIG, admission="lazy")
    with pytest.raises(ConfigError, match="on_new_version.*continue, recompute or drain"):
        dataclasses.replace(BIG, on_new_version="pause")


@pytest.mark.slow
def test_no_compilation_after_warm_up_with_preemptions_and_shared_pages(stories):
    model, tokenizer = stories
    engine = Engine(SMALL, model.config, model.params, detokenize=tokenizer.decode)
    engine.warm_up()
    before = COMPILES.count
    completions = engine.generate(_requests(tokenizer))
    assert COMPILES.count == before, f"{COMPILES.count - before} compilations after warm-up"
    assert engine.stats["preemptions"] > 0 and engine.stats["shared_prefills"] > 0
    assert len(completions) == sum(r.sampling.samples_per_prompt for r in _requests(tokenizer))
