"""``engine.batch_invariant``: a sample's numbers do not depend on the prompts prefilled with it, bit
for bit; and ``engine.preemption``'s choice (config only: the swaps' tokens are in
test_eight_bit.py and test_preemption.py)."""

import dataclasses

import pytest

from rlax_core.config import ConfigError
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request

INVARIANT = EngineConfig(num_slots=4, page_size=8, num_pages=48, max_prompt_len=16, max_new_tokens=24,
                         prefill_buckets=(16,), decode_steps_per_call=8, attention_impl="window", batch_invariant=True)
COMPANIONS = ["Once upon a time there was a girl named Lily", "The big tree was very old and tall", "Sam"]


def test_a_sample_made_alone_is_bit_for_bit_the_one_made_among_other_prompts(stories):
    """Alone, the target's prompt is prefilled in a batch of one; among three other prompts, in a batch
    of four. Without ``batch_invariant`` those are two compiled batch sizes whose products XLA:CPU
    blocks differently: the target's keys then differ in the last bits (1.5e-5 for stories260K) and
    so do its log-probs, and at temperature 1 a draw that close to a token boundary picks the
    neighbour. With it, both run at the one batch size, and the decode window at one width."""
    model, tokenizer = stories
    engine = Engine(INVARIANT, model.config, model.params)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, samples_per_prompt=2, ignore_eos=True)
    target = Request(tokenizer.encode("The little cat sat on the mat", add_bos=True), sampling, prompt_id="target", seed=3)
    alone = engine.generate([target])
    once = dataclasses.replace(sampling, samples_per_prompt=1)
    others = [Request(tokenizer.encode(text, add_bos=True), once, prompt_id=f"c{i}", seed=i)
              for i, text in enumerate(COMPANIONS)]
    # Four slots: the target's two samples and two companions are admitted, and prefilled, together.
    crowded = [c for c in engine.generate([target, *others]) if c.prompt_id == "target"]
    assert [(c.completion_ids, c.logprobs) for c in crowded] == [(c.completion_ids, c.logprobs) for c in alone]


def test_batch_invariant_calls_hold_one_bucket_at_one_batch_size():
    config = dataclasses.replace(INVARIANT, max_prefill_batch=2, max_prompt_len=32, prefill_buckets=(8, 16, 32))
    assert config.prefill_batch_sizes == (2,)
    # Rows of 3, 20, 5, 9 and 7 tokens: buckets 8, 32, 8, 16, 8, grouped by bucket in row order.
    assert config.prefill_calls([3, 20, 5, 9, 7]) == [([0, 2], 2, 8), ([4], 2, 8), ([1], 2, 32), ([3], 2, 16)]
    # Continuations (a turn, a recomputed preemption) run one sequence a call: no long padded rows.
    assert config.continuation_batch_sizes == (1,)
    assert config.prefill_calls([3, 20], continuation=True) == [([0], 1, 8), ([1], 1, 32)]
    varying = dataclasses.replace(config, batch_invariant=False)
    assert varying.continuation_batch_sizes == varying.prefill_batch_sizes
    assert varying.prefill_batch_sizes == (1, 2)
    assert varying.prefill_calls([3, 20, 5, 9, 7]) == [([0, 1], 2, 32), ([2, 3], 2, 16), ([4], 1, 8)]


def test_preemption_swaps_eight_bit_pages_by_default_and_is_validated():
    assert not INVARIANT.swaps_preempted  # float32 pages: recomputed, no host copies
    assert dataclasses.replace(INVARIANT, cache_dtype="int8").swaps_preempted
    assert dataclasses.replace(INVARIANT, preemption="swap").swaps_preempted
    assert not dataclasses.replace(INVARIANT, cache_dtype="int8", preemption="recompute").swaps_preempted
    with pytest.raises(ConfigError, match="preemption.*auto, recompute or swap"):
        dataclasses.replace(INVARIANT, preemption="drop")
