"""Decontamination: drop training rows that share a word n-gram with an evaluation set's prompts."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from rlax_core.data.curation import CONTAMINATED, dead_letter
from rlax_core.data.dedup import ngram_hashes
from transforms.examples import DEAD_LETTER


class NgramIndex(beam.PTransform):
    """Evaluation examples -> ``(n-gram hash, eval set name)`` with one name per hash (the smallest)."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def expand(self, eval_examples):
        n = self.n
        return (
            eval_examples
            | "Ngrams" >> beam.FlatMap(lambda example: [(h, example["source"]) for h in ngram_hashes(example["prompt"], n)])
            | "OneNamePerNgram" >> beam.CombinePerKey(min)
        )


class _DecontaminateFn(beam.DoFn):
    def __init__(self, n: int):
        self.n = n
        self.dropped = Metrics.counter("curate", CONTAMINATED)

    def process(self, example, index):
        matched = [index[h] for h in ngram_hashes(example["prompt"], self.n) if h in index]
        if not matched:
            yield example
            return
        self.dropped.inc()
        sets = sorted(set(matched))
        row = dead_letter(CONTAMINATED, f"shares {len(matched)} {self.n}-gram(s) with {', '.join(sets)}", example,
                          source=example["source"], origin=None, example_id=example["id"])
        row["matched"] = sets
        yield beam.pvalue.TaggedOutput(DEAD_LETTER, row)


class DropContaminated(beam.PTransform):
    """Drop rows sharing any n-gram with ``index`` (an :class:`NgramIndex`); returns ``(kept, dead_letters)``."""

    def __init__(self, index, n: int):
        super().__init__()
        self.index, self.n = index, n

    def expand(self, examples):
        outputs = examples | "Decontaminate" >> beam.ParDo(
            _DecontaminateFn(self.n), index=beam.pvalue.AsDict(self.index)).with_outputs(DEAD_LETTER, main="kept")
        return outputs.kept, outputs[DEAD_LETTER]
