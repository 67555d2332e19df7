"""KeepVerifiedSamples: verified results -> SFT rows, pairs, dead letters with reasons, outcomes, counters."""

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.records import make_example
from rlax_core.data.rejection_sampling import SampleSelection
from transforms.rejection_sampling import KeepVerifiedSamples


def _result(prompt, texts, correct, skipped=None):
    return {"example": make_example(source="s", task="story", prompt=prompt, answer="happy"), "model": "m",
            "texts": texts, "lengths": [len(t) for t in texts], "finish_reasons": ["stop"] * len(texts),
            "correct": correct, "answers": [None] * len(texts), "skipped": skipped}


RESULTS = [_result("mixed", ["a happy day", "sad", "happy", "so happy"], [True, False, True, True]),
           _result("easy", ["happy one", "happy two"], [True, True]),
           _result("hard", ["no", "nope"], [False, False]),
           _result("long", [], [], skipped="prompt of 99 tokens exceeds max_prompt_len=64")]


def test_verified_samples_become_rows_and_the_rest_dead_letters_with_reasons(pipeline):
    with pipeline as p:
        sft, pairs, rejected, outcomes = (p | beam.Create(RESULTS)
                                          | KeepVerifiedSamples(SampleSelection(max_per_prompt=2, pairs_per_prompt=3), "gen"))
        assert_that(sft | "Sft" >> beam.Map(lambda r: (r["prompt"], r["completion"], r["pass_rate"], r["generator"])),
                    equal_to([("mixed", "happy", 0.75, "gen"), ("mixed", "so happy", 0.75, "gen"),
                              ("easy", "happy one", 1.0, "gen"), ("easy", "happy two", 1.0, "gen")]), label="sft")
        assert_that(pairs | "Pairs" >> beam.Map(lambda r: (r["prompt"], r["chosen"], r["rejected"])),
                    equal_to([("mixed", "happy", "sad"), ("mixed", "so happy", "sad"), ("mixed", "a happy day", "sad")]),
                    label="pairs")
        assert_that(rejected | "Rejected" >> beam.Map(lambda r: (r["reason"], r["detail"], r["pass_rate"])),
                    equal_to([("unsolved", "none of 2 samples verified", 0.0),
                              ("skipped", "prompt of 99 tokens exceeds max_prompt_len=64", None)]), label="rejected")
        assert_that(outcomes | "Outcomes" >> beam.Map(lambda o: (o["reason"], o["sft"], o["pairs"])),
                    equal_to([(None, 2, 3), (None, 2, 0), ("unsolved", 0, 0), ("skipped", 0, 0)]), label="outcomes")
    counters = {c.key.metric.name: c.committed for c in
                p.result.metrics().query(MetricsFilter().with_namespace("rft"))["counters"]}
    assert counters == {"prompts_with_data": 2, "unsolved": 1, "skipped": 1, "sft_examples": 4, "pairs": 3}
