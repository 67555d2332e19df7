"""Weight swaps without a drain (``engine.on_new_version``): a version arriving mid-generation is used
from the next decode call, every token records its version, and the trainer reads them."""

import dataclasses

import jax
import numpy as np

from rlax_core.data.records import ROLLOUT_SCHEMA, oldest_policy_version, rollout_row, to_table
from rlax_core.inference.config import SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models import Model
from tests.inference.test_engine import teacher_forced

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)


def _run_with_a_swap(config, model, new, prompts):
    """Both prompts decode one call on version 5, then version 6 arrives; every step is recorded."""
    engine = Engine(config, model.config, model.params, version=5)
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(prompt, GREEDY, prompt_id=i))
    finished = engine.step()
    calls = [engine.stats["decode_calls"]]
    engine.update_weights(new.params, version=6)
    assert engine.version == 6, "installed before the next decode call"
    while engine.has_unfinished():
        finished += engine.step()
        calls.append(engine.stats["decode_calls"])
    assert np.all(np.diff(calls) == 1), "a decode call on every step while sequences run"
    return engine, {c.prompt_id: c for _, c in finished}


def test_a_version_arriving_mid_generation_is_used_from_the_next_decode_call(stories, small_engine_config):
    model, tokenizer = stories
    new = Model(model.config, jax.tree.map(lambda x: x * 0.9, model.params))
    prompts = [tokenizer.encode(t, add_bos=True) for t in ("Once upon a time", "The dog")]
    chunk = small_engine_config.decode_steps_per_call
    alone = Engine(small_engine_config, model.config, model.params, version=5).generate(
        [Request(p, GREEDY, prompt_id=i) for i, p in enumerate(prompts)])

    for mode in ("continue", "recompute"):
        config = dataclasses.replace(small_engine_config, on_new_version=mode)
        engine, by_id = _run_with_a_swap(config, model, new, prompts)
        assert engine.stats["weight_swaps"] == 1
        for i, prompt in enumerate(prompts):
            completion = by_id[i]
            assert completion.token_versions == (5,) * chunk + (6,) * (GREEDY.max_new_tokens - chunk)
            assert completion.weight_version == 5  # the oldest: what the staleness bound reads
            assert completion.completion_ids[:chunk] == alone[i].completion_ids[:chunk]
            if mode == "recompute":  # the cache recomputed: every later token is the new version's greedy choice
                logits = teacher_forced(new, prompt, completion.completion_ids)[len(prompt) - 1: -1]
                assert np.argmax(logits, axis=-1)[chunk:].tolist() == list(completion.completion_ids[chunk:])
            else:
                assert completion.completion_ids[chunk:] != alone[i].completion_ids[chunk:]
        if mode == "recompute":
            assert engine.stats["recomputed"] == len(prompts) and engine.stats["preemptions"] == 0

    # The rollout row keeps the versions; the trainer's staleness bound reads the oldest token's.
    row = rollout_row(by_id[0], example_id="e", group_id="g")
    assert row["policy_version"] == 5 and row["token_versions"][chunk - 1:chunk + 1] == [5, 6]
    single = rollout_row(alone[0], example_id="e", group_id="g")
    assert single["token_versions"] is None  # one version: policy_version says it
    table = to_table([row, single], ROLLOUT_SCHEMA)
    assert oldest_policy_version(table) == 5
    newer = to_table([{**row, "policy_version": 6}], ROLLOUT_SCHEMA)  # a row whose header lies is still caught
    assert oldest_policy_version(newer) == 5
