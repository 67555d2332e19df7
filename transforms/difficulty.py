"""Difficulty filtering: verified samples -> a pass rate per prompt -> keep prompts inside a band."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from rlax_core.data.curation import dead_letter
from transforms.examples import DEAD_LETTER

TOO_EASY, TOO_HARD, SKIPPED = "too_easy", "too_hard", "skipped"


def with_pass_rate(result, model_version: str):
    """The Example row of a verified result, its pass rate and sample count filled in."""
    correct = result["correct"]
    return {**result["example"], "pass_rate": sum(correct) / len(correct), "n_samples": len(correct),
            "filter_model_version": model_version}


class _BandFn(beam.DoFn):
    def __init__(self, low: float, high: float, model_version: str):
        self.low, self.high, self.model_version = low, high, model_version

    def process(self, result):
        example = result["example"]
        if result["skipped"] or not result["correct"]:
            Metrics.counter("filter", SKIPPED).inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter(
                SKIPPED, result["skipped"] or "no samples", example, source=example["source"], origin=None,
                example_id=example["id"]))
            return
        row = with_pass_rate(result, self.model_version)
        if self.low <= row["pass_rate"] <= self.high:
            Metrics.counter("filter", "kept").inc()
            yield row
            return
        reason = TOO_EASY if row["pass_rate"] > self.high else TOO_HARD
        Metrics.counter("filter", reason).inc()
        rejected = dead_letter(reason, f"pass rate {row['pass_rate']:.3f} outside [{self.low}, {self.high}]", row,
                               source=example["source"], origin=None, example_id=example["id"])
        rejected["pass_rate"] = row["pass_rate"]
        yield beam.pvalue.TaggedOutput(DEAD_LETTER, rejected)


class KeepPassRateBand(beam.PTransform):
    """Verified results -> ``(kept Example rows with pass_rate, rejected rows with their reason)``.

    Kept: ``low <= pass rate <= high``. Rejected: ``too_easy``, ``too_hard``, or ``skipped`` (the
    prompt did not fit the engine).
    """

    def __init__(self, low: float, high: float, model_version: str):
        super().__init__()
        self.low, self.high, self.model_version = low, high, model_version

    def expand(self, results):
        outputs = results | "Band" >> beam.ParDo(_BandFn(self.low, self.high, self.model_version)).with_outputs(
            DEAD_LETTER, main="kept")
        return outputs.kept, outputs[DEAD_LETTER]


def pass_rates_of(results):
    """``pass_rate`` of every verified (not skipped) result, for the histogram."""
    return results | "PassRates" >> beam.FlatMap(
        lambda r: [sum(r["correct"]) / len(r["correct"])] if r["correct"] and not r["skipped"] else [])
