"""KeepPassRateBand: pass rates from verdicts, the band kept, the rest rejected with a reason."""

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.records import make_example
from transforms.difficulty import KeepPassRateBand, pass_rates_of


def _result(prompt, correct, skipped=None):
    return {"example": make_example(source="s", task="math", prompt=prompt, answer="1"), "model": "m",
            "texts": ["x"] * len(correct), "lengths": [1] * len(correct), "finish_reasons": ["stop"] * len(correct),
            "correct": correct, "answers": [None] * len(correct), "skipped": skipped}


def test_band_keeps_middle_pass_rates(pipeline):
    results = [_result("easy", [True] * 4), _result("hard", [False] * 4), _result("middle", [True, False, False, True]),
               _result("edge", [True, False, False, False]), _result("long", [], skipped="prompt too long")]
    with pipeline as p:
        rows = p | beam.Create(results)
        kept, rejected = rows | KeepPassRateBand(0.25, 0.75, "v7")
        assert_that(kept | "Kept" >> beam.Map(lambda r: (r["prompt"], r["pass_rate"], r["n_samples"], r["filter_model_version"])),
                    equal_to([("middle", 0.5, 4, "v7"), ("edge", 0.25, 4, "v7")]), label="kept")
        assert_that(rejected | "Rejected" >> beam.Map(lambda r: (r["reason"], r.get("pass_rate"))),
                    equal_to([("too_easy", 1.0), ("too_hard", 0.0), ("skipped", None)]), label="rejected")
        assert_that(pass_rates_of(rows), equal_to([1.0, 0.0, 0.5, 0.25]), label="rates")
