"""Duplicate removal across the whole dataset: exact (normalised text) and near (MinHash + LSH).

Both keep one canonical row per group, chosen by the smallest example id, so the result does not
depend on input order, sharding or the runner. Dropped rows go to the dead-letter output naming the
row they duplicate.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from rlax_core.data.curation import DUPLICATE, NEAR_DUPLICATE, dead_letter
from rlax_core.data.dedup import estimated_jaccard, exact_key, lsh_band_keys, lsh_params, minhash_signature
from transforms.examples import DEAD_LETTER


def _canonical_order(example):
    return (example["id"], example["answer"] or "", example["source"])


def _keep_canonical(keyed_group):
    _, examples = keyed_group
    examples = sorted(examples, key=_canonical_order)
    kept = examples[0]
    yield kept
    for other in examples[1:]:
        kind = "exact" if other["prompt"] == kept["prompt"] else "surface"
        yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter(
            DUPLICATE, f"{kind} duplicate of {kept['id']}", other, source=other["source"], origin=None,
            example_id=other["id"]))


class DropExactDuplicates(beam.PTransform):
    """Group rows by the hash of their normalised prompt, keep one; returns ``(kept, dead_letters)``."""

    def expand(self, examples):
        outputs = (
            examples
            | "KeyByNormalisedPrompt" >> beam.Map(lambda example: (exact_key(example["prompt"]), example))
            | "GroupByPrompt" >> beam.GroupByKey()
            | "KeepCanonical" >> beam.FlatMap(_keep_canonical).with_outputs(DEAD_LETTER, main="kept")
        )
        return outputs.kept, outputs[DEAD_LETTER]


class _BandKeysFn(beam.DoFn):
    """(band key, (id, signature)) for each LSH band of each row."""

    def __init__(self, threshold: float, num_perm: int, shingle_size: int, seed: int):
        self.threshold, self.num_perm, self.shingle_size, self.seed = threshold, num_perm, shingle_size, seed

    def process(self, example):
        signature = minhash_signature(example["prompt"], num_perm=self.num_perm, shingle_size=self.shingle_size,
                                      seed=self.seed)
        bands, rows = lsh_params(self.threshold, self.num_perm)
        for key in lsh_band_keys(signature, bands, rows):
            yield key, (example["id"], signature)


def _similar_pairs(bucket, threshold):
    """(larger id, smaller id) for every pair in an LSH bucket whose estimated Jaccard reaches ``threshold``."""
    _, members = bucket
    members = sorted({identifier: signature for identifier, signature in members}.items())
    for j in range(1, len(members)):
        for i in range(j):
            if estimated_jaccard(members[i][1], members[j][1]) >= threshold:
                yield members[j][0], members[i][0]


def _drop_if_near_duplicate(keyed):
    identifier, grouped = keyed
    (example,) = grouped["example"]
    duplicate_of = grouped["duplicate_of"]
    if not duplicate_of:
        yield example
        return
    Metrics.counter("curate", NEAR_DUPLICATE).inc()
    yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter(
        NEAR_DUPLICATE, f"near duplicate of {min(duplicate_of)}", example, source=example["source"], origin=None,
        example_id=identifier))


class DropNearDuplicates(beam.PTransform):
    """Drop each row that has a near duplicate with a smaller id; returns ``(kept, dead_letters)``.

    Rows sharing an LSH bucket are candidates; a candidate pair counts when the signatures' estimated
    Jaccard similarity reaches ``threshold``. Ids must be unique (run after exact dedup).
    """

    def __init__(self, threshold: float, num_perm: int = 128, shingle_size: int = 3, seed: int = 1):
        super().__init__()
        self.threshold, self.num_perm, self.shingle_size, self.seed = threshold, num_perm, shingle_size, seed

    def expand(self, examples):
        duplicate_of = (
            examples
            | "BandKeys" >> beam.ParDo(_BandKeysFn(self.threshold, self.num_perm, self.shingle_size, self.seed))
            | "GroupByBand" >> beam.GroupByKey()
            | "SimilarPairs" >> beam.FlatMap(_similar_pairs, self.threshold)
            | "SmallestMatch" >> beam.CombinePerKey(min)
        )
        by_id = examples | "KeyById" >> beam.Map(lambda example: (example["id"], example))
        outputs = (
            {"example": by_id, "duplicate_of": duplicate_of}
            | "JoinMatches" >> beam.CoGroupByKey()
            | "DropMatched" >> beam.FlatMap(_drop_if_near_duplicate).with_outputs(DEAD_LETTER, main="kept")
        )
        return outputs.kept, outputs[DEAD_LETTER]
