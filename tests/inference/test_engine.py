"""The engine against the model's own full forward, plus its sampling, stopping and scheduling rules."""

import dataclasses

import jax
import numpy as np
import pytest

from rlax_core.config import ConfigError
from rlax_core.inference.config import SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.inference.sampling import SamplingMode
from tests.support.compiles import COMPILES
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(stories, small_engine_config):
    model, tokenizer = stories
    return Engine(small_engine_config, model.config, model.params, detokenize=tokenizer.decode)


def teacher_forced(model, prompt, completion, padded_to=288):
    """Full-forward logits over prompt + completion: row t predicts token t + 1.

    Right-padded to one length so that the jitted forward compiles once for all tests.
    """
    ids = list(prompt) + list(completion)
    mask = np.zeros((1, padded_to), np.int32)
    mask[0, : len(ids)] = 1
    padded = np.zeros((1, padded_to), np.int32)
    padded[0, : len(ids)] = ids
    return np.asarray(model(padded, mask)[0, : len(ids)])


def test_greedy_reproduces_the_stories260K_readme_text(engine, stories, stories260k_dir):
    model, tokenizer = stories
    readme = (stories260k_dir / "README_stories260K.md").read_text()
    expected = readme.split("```")[3].split("\n", 2)[2].strip()  # the `./run ... -t 0.0` output block
    [completion] = engine.generate([Request([model.config.bos_token_id], SamplingParams(
        temperature=0.0, max_new_tokens=256, ignore_eos=True))])
    text = tokenizer.decode([model.config.bos_token_id, *completion.completion_ids], skip_special_tokens=True)
    assert text.startswith(expected), text
    # ... and every token is the argmax of the full forward over the tokens before it.
    logits = teacher_forced(model, [model.config.bos_token_id], completion.completion_ids)
    assert np.argmax(logits[:-1], axis=-1).tolist() == list(completion.completion_ids)


def test_ragged_greedy_batch_equals_full_forward_argmax_and_logprobs(engine, stories):
    model, tokenizer = stories
    texts = ["Once upon a time", "The dog", "Lily and Ben went to the park with their mom and", "A"]
    extra = ["Tom had a red ball", "The sun was hot"]  # more prompts than slots: continuous batching
    requests = [Request(tokenizer.encode(t, add_bos=True), GREEDY, prompt_id=i) for i, t in enumerate(texts + extra)]
    completions = engine.generate(requests)
    assert [c.prompt_id for c in completions] == list(range(len(requests)))
    for request, completion in zip(requests, completions):
        assert completion.finish_reason == "length" and len(completion.completion_ids) == GREEDY.max_new_tokens
        logits = teacher_forced(model, request.prompt_ids, completion.completion_ids)
        predicting = logits[len(request.prompt_ids) - 1: -1]  # rows that predict each completion token
        assert np.argmax(predicting, axis=-1).tolist() == list(completion.completion_ids)
        expected = jax.nn.log_softmax(predicting, axis=-1)[np.arange(len(predicting)), list(completion.completion_ids)]
        # Incremental decode against one full forward: the same sums in another order.
        bound = decoder_logprob_bound(model.config, context=len(request.prompt_ids) + len(completion.completion_ids))
        assert_reordered_close(completion.logprobs, expected, bound)


def test_same_seed_same_tokens_other_seed_other_tokens(engine, stories):
    _, tokenizer = stories
    prompt = tokenizer.encode("Once upon a time", add_bos=True)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=20, samples_per_prompt=3, ignore_eos=True)
    first = engine.generate([Request(prompt, params, prompt_id="p", seed=7)])
    again = engine.generate([Request(prompt, params, prompt_id="p", seed=7)])
    other = engine.generate([Request(prompt, params, prompt_id="p", seed=8)])
    assert [c.completion_ids for c in first] == [c.completion_ids for c in again]
    assert [c.logprobs for c in first] == [c.logprobs for c in again]
    assert [c.sample_index for c in first] == [0, 1, 2]
    assert len({c.completion_ids for c in first}) == 3, "samples of one prompt use different keys"
    assert [c.completion_ids for c in first] != [c.completion_ids for c in other]


def test_a_sample_does_not_depend_on_its_batch_companions(engine, stories):
    """One rollout regenerated alone equals the same rollout made in a full, busy batch."""
    _, tokenizer = stories
    params = SamplingParams(temperature=0.8, top_k=40, max_new_tokens=32, samples_per_prompt=2, ignore_eos=True)
    target = Request(tokenizer.encode("The little cat", add_bos=True), params, prompt_id="target", seed=3)
    alone = engine.generate([target])
    companions = [Request(tokenizer.encode(t, add_bos=True), params, prompt_id=f"c{i}", seed=i)
                  for i, t in enumerate(["Once upon a time there was", "Sam", "The big tree was very old and"])]
    crowded = [c for c in engine.generate([companions[0], companions[1], target, companions[2]])
               if c.prompt_id == "target"]
    assert [c.completion_ids for c in crowded] == [c.completion_ids for c in alone]
    # A batch of 4 against 1: XLA may tile the batched products differently, so the sums' orders differ.
    for a, b in zip(crowded, alone):
        bound = decoder_logprob_bound(engine.model_config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)


def test_stop_tokens_stop_strings_and_lengths(engine, stories):
    model, tokenizer = stories
    prompt = tokenizer.encode("Once upon a time", add_bos=True)
    [free] = engine.generate([Request(prompt, GREEDY)])
    stop_token = free.completion_ids[5]
    first_at = free.completion_ids.index(stop_token)
    [by_token] = engine.generate([Request(prompt, dataclasses.replace(GREEDY, stop_token_ids=(stop_token,)))])
    assert by_token.finish_reason == "stop" and by_token.completion_ids == free.completion_ids[: first_at + 1]
    assert len(by_token.logprobs) == len(by_token.completion_ids)

    [by_string] = engine.generate([Request(prompt, dataclasses.replace(GREEDY, stop_strings=("little",)))])
    text = tokenizer.decode(by_string.completion_ids)
    assert by_string.finish_reason == "stop" and text.endswith("little") or "little" in text
    assert "little" not in tokenizer.decode(by_string.completion_ids[:-1])

    [short] = engine.generate([Request(prompt, dataclasses.replace(GREEDY, max_new_tokens=1))])
    assert short.finish_reason == "length" and short.completion_ids == free.completion_ids[:1]


@pytest.mark.slow
def test_eos_stops_unless_ignored(engine, stories):
    model, tokenizer = stories
    prompt = tokenizer.encode("Once upon a time", add_bos=True)
    stopping = SamplingParams(temperature=1.0, max_new_tokens=256, samples_per_prompt=8)
    completions = engine.generate([Request(prompt, stopping, seed=3)])  # a seed under which stories end early
    # stories260K ends a story with BOS (ids 1 and 2 are both its stop ids).
    eos = set(model.config.eos_token_ids)
    assert any(c.finish_reason == "stop" for c in completions)
    for c in completions:
        assert not set(c.completion_ids[:-1]) & eos
        assert (c.finish_reason == "stop") == (c.completion_ids[-1] in eos)
    ignoring = engine.generate([Request(prompt, dataclasses.replace(stopping, ignore_eos=True), seed=3)])
    assert all(c.finish_reason == "length" and len(c.completion_ids) == 256 for c in ignoring)
    for stopped, kept_going in zip(completions, ignoring):
        assert kept_going.completion_ids[: len(stopped.completion_ids)] == stopped.completion_ids


@pytest.mark.slow
def test_admission_waits_for_pages_and_frees_them(stories, small_engine_config):
    model, tokenizer = stories
    # 12 usable pages of 8 tokens; under "reserve" each request takes ceil((5 + 40) / 8) = 6 at
    # admission: two fit at a time (on_demand admission is tests/inference/test_preemption.py's).
    config = dataclasses.replace(small_engine_config, num_pages=13, max_new_tokens=40, admission="reserve")
    engine = Engine(config, model.config, model.params)
    prompt = tokenizer.encode("Once upon a time", add_bos=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    for i in range(5):
        engine.add_request(Request(prompt, params, prompt_id=i))
    running_counts, finished = [], []
    while engine.has_unfinished():
        finished += engine.step()
        running_counts.append(engine.active_slots())
    assert max(running_counts) == 2 and len(finished) == 5
    assert all(len(c.completion_ids) == 40 for _, c in finished)
    assert len({c.completion_ids for _, c in finished}) == 1
    assert engine.pages.num_free == 12


@pytest.mark.parametrize("bad, match", [
    (Request([], GREEDY), "empty prompt"),
    (Request([1] * 33, GREEDY), "max_prompt_len"),
    (Request([1, 9999], GREEDY), "token ids"),
    (Request([1], SamplingParams(max_new_tokens=257)), "max_new_tokens"),
    (Request([1], GREEDY, seed=-1), "seed"),
])
def test_bad_requests_fail_with_the_reason(engine, bad, match):
    with pytest.raises(ValueError, match=match):
        engine.add_request(bad)


@pytest.mark.slow
def test_no_compilation_after_warm_up_across_lengths_fills_and_weight_swaps(engine, stories, small_engine_config):
    model, _ = stories
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)
    engine.warm_up(modes=(SamplingMode.GREEDY,))  # every prefill bucket and decode window width
    engine.update_weights(model.params, engine.version + 1)
    fresh_copies = [jax.tree.map(lambda x: x * 1.0, model.params) for _ in range(6)]  # new buffers, same shapes

    before = COMPILES.count
    for round_index in range(6):
        count = int(rng.integers(1, 8))  # from one request to more than the slots hold
        lengths = rng.integers(1, small_engine_config.max_prompt_len + 1, count)
        varied = dataclasses.replace(params, max_new_tokens=int(rng.integers(1, 200)))  # many window widths
        completions = engine.generate([Request(rng.integers(3, 512, n).tolist(), varied) for n in lengths])
        assert all(len(c.completion_ids) == varied.max_new_tokens for c in completions)
        engine.update_weights(fresh_copies[round_index], engine.version + 1)
    assert COMPILES.count == before, f"{COMPILES.count - before} compilations after warm-up"


@pytest.mark.slow
def test_a_fresh_engine_compiles_nothing_after_warm_up(stories, small_engine_config):
    # Its own engine: one that earlier tests ran has a program-made cache, which hid the first
    # prefill's recompilation (found by the rollout worker under load, docs/loop.md).
    model, tokenizer = stories
    # On a device, as every ReplicatedEngine replica is: its programs' outputs are committed there.
    engine = Engine(small_engine_config, model.config, model.params, version=0, device=jax.devices()[0])
    engine.warm_up(modes=(SamplingMode.GREEDY,))
    before = COMPILES.count
    engine.generate([Request(tokenizer.encode("Once upon a time", add_bos=True),
                             SamplingParams(temperature=0.0, max_new_tokens=5))])
    assert COMPILES.count == before, f"{COMPILES.count - before} compilations after warm-up"


def test_a_drained_weight_swap_tags_versions_and_never_mixes_them(stories, small_engine_config):
    from rlax_core.models import Model

    model, tokenizer = stories
    old, new = model, Model(model.config, jax.tree.map(lambda x: x * 0.9, model.params))
    engine = Engine(dataclasses.replace(small_engine_config, num_slots=2, on_new_version="drain"), model.config,
                    old.params, version=5)
    params = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    prompts = [tokenizer.encode(t, add_bos=True) for t in ("Once upon a time", "The dog", "Tom saw", "A bird")]
    engine.add_request(Request(prompts[0], params, prompt_id=0))
    engine.add_request(Request(prompts[1], params, prompt_id=1))
    finished = engine.step()  # both now in flight, 17 tokens in
    engine.update_weights(new.params, version=6)
    assert engine.version == 5, "the swap waits for the sequences in flight"
    engine.add_request(Request(prompts[2], params, prompt_id=2))
    engine.add_request(Request(prompts[3], params, prompt_id=3))
    while engine.has_unfinished():
        finished += engine.step()
    by_id = {c.prompt_id: c for _, c in finished}
    assert [by_id[i].weight_version for i in range(4)] == [5, 5, 6, 6]
    assert all(set(by_id[i].token_versions) == {by_id[i].weight_version} for i in range(4))
    assert engine.version == 6 and engine.stats["weight_swaps"] == 1
    # Every token of each completion is the greedy choice of the version it is tagged with, alone.
    for i, prompt in enumerate(prompts):
        completion = by_id[i]
        for weights, agrees in ((old, completion.weight_version == 5), (new, completion.weight_version == 6)):
            logits = teacher_forced(weights, prompt, completion.completion_ids)[len(prompt) - 1: -1]
            assert (np.argmax(logits, axis=-1).tolist() == list(completion.completion_ids)) == agrees

    with pytest.raises(ValueError, match="differ in structure"):
        engine.update_weights({"embed_tokens": model.params["embed_tokens"]}, version=7)


@pytest.mark.slow  # the Pallas interpreter inside the compiled decode loop: slow to compile on CPU
def test_pallas_engine_matches_reference_engine(engine, stories, small_engine_config):
    _, tokenizer = stories
    pallas = Engine(dataclasses.replace(small_engine_config, attention_impl="pallas"), engine.model_config,
                    stories[0].params)
    params = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    requests = [Request(tokenizer.encode(t, add_bos=True), params, prompt_id=i)
                for i, t in enumerate(["Once upon a time", "The dog ran"])]
    _assert_same_samples(pallas.generate(requests), engine.generate(requests), engine.model_config)


def _assert_same_samples(ours, theirs, model_config):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.completion_ids == b.completion_ids
        # float32 attention summed in another order: within the bound of that reordering.
        bound = decoder_logprob_bound(model_config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)


def test_window_engine_matches_reference_engine(engine, stories, small_engine_config):
    """The CPU fast path (a dense window per decode call) against the per-step paged reference."""
    model, tokenizer = stories
    reference = Engine(dataclasses.replace(small_engine_config, attention_impl="reference"), model.config,
                       model.params)
    assert engine.attention == "window" and reference.attention == "reference"
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=40, samples_per_prompt=3, ignore_eos=True)
    # Six samples through four slots: later samples reuse freed slots and pages mid-generation.
    requests = [Request(tokenizer.encode(t, add_bos=True), sampled, prompt_id=i, seed=7)
                for i, t in enumerate(["Once upon a time", "The dog ran to the big"])]
    _assert_same_samples(engine.generate(requests), reference.generate(requests), model.config)


def test_samples_of_a_request_share_one_prefill_and_equal_unshared_samples(engine, stories, small_engine_config):
    model, tokenizer = stories
    alone = Engine(dataclasses.replace(small_engine_config, num_slots=1), model.config, model.params)
    request = Request(tokenizer.encode("Once upon a time there was a little", add_bos=True),
                      SamplingParams(temperature=1.0, max_new_tokens=20, samples_per_prompt=4, ignore_eos=True),
                      prompt_id="p", seed=3)
    before = engine.stats["shared_prefills"]
    shared = engine.generate([request])
    assert engine.stats["shared_prefills"] - before == 3  # one prefill, three page copies
    one_at_a_time = alone.generate([request])
    assert alone.stats["shared_prefills"] == 0
    assert len({c.completion_ids for c in shared}) > 1  # the samples differ from one another
    _assert_same_samples(shared, one_at_a_time, model.config)


def test_max_prefill_batch_splits_a_prefill_without_changing_the_samples(engine, stories, small_engine_config):
    model, tokenizer = stories
    one_prompt_per_call = Engine(dataclasses.replace(small_engine_config, max_prefill_batch=1), model.config,
                                 model.params)
    requests = [Request(tokenizer.encode(t, add_bos=True), GREEDY, prompt_id=i)
                for i, t in enumerate(["Once upon a time", "The dog ran", "Lily saw a big"])]
    _assert_same_samples(one_prompt_per_call.generate(requests), engine.generate(requests), model.config)
    assert one_prompt_per_call.stats["prefill_calls"] == 3  # admitted together, prefilled one by one


def test_prefill_batch_growth_compiles_fewer_sizes_and_a_batch_between_two_runs_padded_without_compiling(
        stories, small_engine_config):
    config = dataclasses.replace(small_engine_config, max_prefill_batch=16, num_slots=16, prefill_batch_growth=4)
    assert config.prefill_batch_sizes == config.continuation_batch_sizes == (1, 4, 16)
    assert dataclasses.replace(config, max_prefill_batch=8).prefill_batch_sizes == (1, 4, 8)
    assert dataclasses.replace(config, prefill_batch_growth=2).prefill_batch_sizes == (1, 2, 4, 8, 16)
    assert config.prefill_calls([3, 5, 9]) == [([0, 1, 2], 4, 16)]  # three rows: the batch of 4
    with pytest.raises(ConfigError, match="prefill_batch_growth"):
        dataclasses.replace(config, prefill_batch_growth=1)
    model, tokenizer = stories
    # Batch sizes 1 and 4 only; one prompt bucket, reserved pages (no continuations): few programs.
    small = dataclasses.replace(small_engine_config, max_prefill_batch=4, max_prompt_len=16, prefill_buckets=(16,),
                                max_new_tokens=8, admission="reserve", prefill_batch_growth=4)
    assert small.prefill_batch_sizes == (1, 4)
    engine = Engine(small, model.config, model.params, version=0, device=jax.devices()[0])
    engine.warm_up(modes=(SamplingMode.GREEDY,))
    before = COMPILES.count
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    prompts = ["Once upon a time", "The dog", "Tom saw a big"]
    together = engine.generate([Request(tokenizer.encode(p, add_bos=True), greedy, prompt_id=i)
                                for i, p in enumerate(prompts)])  # 3 prompts: prefilled as 4
    assert COMPILES.count == before, f"{COMPILES.count - before} compilations after warm-up"
    alone = engine.generate([Request(tokenizer.encode(prompts[2], add_bos=True), greedy, prompt_id=2)])
    assert alone[0].completion_ids == together[2].completion_ids
