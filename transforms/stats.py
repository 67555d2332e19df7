"""The counts of a curation run: input = kept + duplicate + near_duplicate + contaminated + dead_lettered."""

from __future__ import annotations

from collections import Counter

import apache_beam as beam

from rlax_core.data.curation import STAT_NAMES, stat_category


class _OutcomeCounts(beam.CombineFn):
    """Counters of (category), (source, category), (reason) and (eval set matched) over all outcomes."""

    def create_accumulator(self):
        return Counter()

    def add_input(self, accumulator, outcome):
        category, source, reason, matched = outcome
        accumulator[("total", category)] += 1
        accumulator[("source", source or "?", category)] += 1
        if reason:
            accumulator[("reason", reason)] += 1
        for name in matched:
            accumulator[("matched", name)] += 1
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = Counter()
        for accumulator in accumulators:
            merged.update(accumulator)
        return merged

    def extract_output(self, accumulator):
        return dict(accumulator)


def _report(counts, input_count):
    totals = {name: 0 for name in STAT_NAMES}
    by_source, by_reason, contaminated_by = {}, {}, {}
    for key, value in counts.items():
        if key[0] == "total":
            totals[key[1]] += value
        elif key[0] == "source":
            by_source.setdefault(key[1], {name: 0 for name in STAT_NAMES})[key[2]] += value
        elif key[0] == "reason":
            by_reason[key[1]] = value
        else:
            contaminated_by[key[1]] = value
    return {"input": input_count, **totals, "consistent": input_count == sum(totals.values()),
            "by_source": by_source, "dead_letter_reasons": by_reason, "contaminated_by": contaminated_by}


class CurationStats(beam.PTransform):
    """One dict of counts from the raw input rows, the kept examples and every dead-letter row."""

    def __init__(self, raw_rows, dead_letters):
        super().__init__()
        self.raw_rows, self.dead_letters = raw_rows, dead_letters

    def expand(self, kept):
        input_count = self.raw_rows | "CountInput" >> beam.combiners.Count.Globally()
        kept_outcomes = kept | "KeptOutcome" >> beam.Map(lambda example: ("kept", example["source"], None, ()))
        rejected_outcomes = self.dead_letters | "RejectedOutcome" >> beam.Map(
            lambda row: (stat_category(row["reason"]), row["source"], row["reason"], tuple(row.get("matched") or ())))
        return (
            (kept_outcomes, rejected_outcomes)
            | "AllOutcomes" >> beam.Flatten()
            | "Count" >> beam.CombineGlobally(_OutcomeCounts())
            | "Report" >> beam.Map(_report, beam.pvalue.AsSingleton(input_count))
        )
