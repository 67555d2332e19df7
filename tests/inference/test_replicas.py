"""One engine per device: the same completions as one engine, on the devices asked for, in order."""

import dataclasses

import jax
import pytest

from rlax_core.inference.config import SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.inference.replicas import ReplicatedEngine
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, samples_per_prompt=3, ignore_eos=True)
TEXTS = ["Once upon a time", "The dog ran to the big", "Lily", "A boy found a box and", "Tom"]

# tests/conftest.py gives every test process 8 simulated CPU devices unless XLA_FLAGS says otherwise.
pytestmark = pytest.mark.skipif(jax.local_device_count() < 2, reason="replicas need two devices")


@pytest.fixture(scope="module")
def replicated(stories, small_engine_config):
    model, tokenizer = stories
    return ReplicatedEngine(small_engine_config, model.config, model.params, detokenize=tokenizer.decode,
                            devices=jax.local_devices()[:2])


def _requests(tokenizer, sampling=SAMPLED):
    return [Request(tokenizer.encode(t, add_bos=True), sampling, prompt_id=f"p{i}", seed=11)
            for i, t in enumerate(TEXTS)]


def test_replicas_give_one_engines_completions_in_request_then_sample_order(replicated, stories,
                                                                           small_engine_config):
    model, tokenizer = stories
    single = Engine(small_engine_config, model.config, model.params)
    requests = _requests(tokenizer)
    ours, theirs = replicated.generate(requests), single.generate(requests)
    assert [(c.prompt_id, c.sample_index) for c in ours] == [(f"p{i}", s) for i in range(len(TEXTS)) for s in range(3)]
    assert [c.completion_ids for c in ours] == [c.completion_ids for c in theirs]
    # The batches differ (each replica holds a part), and with them the order of some float sums.
    for a, b in zip(ours, theirs):
        bound = decoder_logprob_bound(model.config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)


def test_each_replica_runs_on_its_device_and_both_take_work(replicated, stories, small_engine_config):
    model, tokenizer = stories
    assert [engine.device for engine in replicated.engines] == jax.local_devices()[:2]
    for engine in replicated.engines:
        assert jax.tree.leaves(engine.params)[0].devices() == {engine.device}
        assert all(pool.devices() == {engine.device} for pool in (*engine.cache.k, *engine.cache.v))
    requests = _requests(tokenizer)
    # The module's engine is shared with other tests: count only what this call adds.
    before = [dict(engine.stats) for engine in replicated.engines]
    replicated.generate(requests)
    done = [engine.stats["tokens"] - b["tokens"] for engine, b in zip(replicated.engines, before)]
    assert all(count > 0 for count in done) and sum(done) == len(TEXTS) * 3 * SAMPLED.max_new_tokens
    # A request's samples stay on one replica, so they share prefills there exactly as on one engine
    # given that replica's requests (a request split across replicas would share fewer).
    shares = replicated._deal(requests)
    assert sorted(i for share in shares for i in share) == list(range(len(TEXTS)))
    shared = sum(engine.stats["shared_prefills"] - b["shared_prefills"] for engine, b in zip(replicated.engines, before))
    single = Engine(small_engine_config, model.config, model.params)
    for share in shares:
        single.generate([requests[i] for i in share])
    assert shared == single.stats["shared_prefills"] > 0


def test_requests_are_dealt_by_sample_tokens_deterministically(replicated, stories):
    _, tokenizer = stories
    long_one = SamplingParams(temperature=0.0, max_new_tokens=200, samples_per_prompt=4, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    requests = [Request([1, 2, 3], long_one, prompt_id="long")] + [
        Request([1, 2, 3], short, prompt_id=f"s{i}") for i in range(6)]
    assert replicated._deal(requests) == [[0], [1, 2, 3, 4, 5, 6]]
    assert replicated._deal(requests) == replicated._deal(requests)


def test_weight_swap_reaches_every_replica(stories, small_engine_config):
    model, tokenizer = stories
    replicated = ReplicatedEngine(small_engine_config, model.config, model.params, version=3,
                                  devices=jax.local_devices()[:2])
    newer = jax.tree.map(lambda x: x * 0.9, model.params)
    replicated.update_weights(newer, version=4)
    assert replicated.version == 4 and all(engine.version == 4 for engine in replicated.engines)
    completions = replicated.generate(_requests(tokenizer))
    assert {c.weight_version for c in completions} == {4}
    reference = Engine(small_engine_config, model.config, newer, version=4).generate(_requests(tokenizer))
    assert [c.completion_ids for c in completions] == [c.completion_ids for c in reference]
    replicated.close()


def test_replicas_come_from_the_config_and_an_engine_is_one(stories, small_engine_config):
    model, _ = stories
    two = ReplicatedEngine(dataclasses.replace(small_engine_config, replicas=2), model.config, model.params)
    assert [engine.device for engine in two.engines] == jax.local_devices()[:2]
    assert all(engine.config.replicas == 1 for engine in two.engines)
    every = ReplicatedEngine(dataclasses.replace(small_engine_config, replicas=0, num_pages=16, max_new_tokens=8),
                             model.config, model.params)
    assert len(every.engines) == jax.local_device_count()
    with pytest.raises(ValueError, match="replicas=999 but this process has 8 device.s., and 1 device.s. per replica .engine.tensor_parallel x expert_parallel. need 999"):
        ReplicatedEngine(dataclasses.replace(small_engine_config, replicas=999), model.config, model.params)
    with pytest.raises(ValueError, match="an Engine is one replica"):
        Engine(dataclasses.replace(small_engine_config, replicas=2), model.config, model.params)
    with pytest.raises(ValueError, match="replicas"):
        dataclasses.replace(small_engine_config, replicas=-1)


def test_a_bad_request_fails_with_its_reason(replicated):
    too_long = Request(list(range(3, 40)), SAMPLED, prompt_id="too-long")
    with pytest.raises(ValueError, match="max_prompt_len"):
        replicated.generate([too_long])
