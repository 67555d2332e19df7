"""Rejection-sampling data: verified results -> SFT rows, preference pairs, dead letters, per-prompt outcomes.

A shell over ``rlax_core.data.rejection_sampling``: the rules (which samples, in which order, which
pairs) are there.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from rlax_core.data.curation import dead_letter
from rlax_core.data.rejection_sampling import SampleSelection, rejection_sampling_data
from transforms.examples import DEAD_LETTER

PAIRS, OUTCOMES = "pairs", "outcomes"


class _KeepVerifiedFn(beam.DoFn):
    def __init__(self, selection: SampleSelection, generator: str):
        self.selection, self.generator = selection, generator

    def process(self, result):
        example = result["example"]
        data = rejection_sampling_data(result, self.selection, self.generator)
        yield beam.pvalue.TaggedOutput(OUTCOMES, {"reason": data.reason, "pass_rate": data.pass_rate,
                                                  "sft": len(data.sft), "pairs": len(data.pairs),
                                                  "duplicates": data.duplicates})
        Metrics.counter("rft", data.reason or "prompts_with_data").inc()
        Metrics.counter("rft", "sft_examples").inc(len(data.sft))
        Metrics.counter("rft", "pairs").inc(len(data.pairs))
        if data.reason is not None:
            rejected = dead_letter(data.reason, data.detail, example, source=example["source"], origin=None,
                                   example_id=example["id"])
            rejected["pass_rate"] = data.pass_rate
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, rejected)
            return
        yield from data.sft
        for pair in data.pairs:
            yield beam.pvalue.TaggedOutput(PAIRS, pair)


class KeepVerifiedSamples(beam.PTransform):
    """Verified results of ``SampleAndVerify`` -> ``(sft rows, preference pairs, dead letters, outcomes)``.

    Args:
      selection: how many samples per prompt, in which order, and how many pairs.
      generator: what the rows record as the model that wrote the completions.

    Dead letters: ``unsolved`` (no sample verified) and ``skipped`` (the prompt did not fit the
    engine), each with its reason. ``outcomes``: one dict per prompt (``reason``, ``pass_rate``,
    ``sft``, ``pairs``, ``duplicates``) for the stats.
    """

    def __init__(self, selection: SampleSelection, generator: str):
        super().__init__()
        self.selection, self.generator = selection, generator

    def expand(self, results):
        outputs = results | "KeepVerified" >> beam.ParDo(_KeepVerifiedFn(self.selection, self.generator)).with_outputs(
            PAIRS, DEAD_LETTER, OUTCOMES, main="sft")
        return outputs.sft, outputs[PAIRS], outputs[DEAD_LETTER], outputs[OUTCOMES]
