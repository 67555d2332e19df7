"""Sampling completions with the RLAX engine inside Beam's RunInference, and verifying them.

:class:`EngineModelHandler` is a RunInference ``ModelHandler``: RunInference loads the model once per
worker process (through ``apache_beam.utils.shared``: an ``EngineHost``, as rollouts hold) and every
DoFn thread of that process uses it; it batches examples (``batch_size`` prompts per engine call)
and the engine decodes the samples of a batch together with continuous batching. Samples are keyed by (seed, example id, sample index), so
the same example gets the same samples whatever batch or worker it lands in.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, RunInference

from rlax_core.inference.config import GenerationSpec
from rlax_core.rollout.host import EngineHost
from rlax_core.utils.compile_cache import enable_compilation_cache


class EngineModelHandler(ModelHandler[dict, dict, EngineHost]):
    """RunInference handler: Example rows in, ``{example, model, texts, lengths, finish_reasons}`` out."""

    def __init__(self, spec: GenerationSpec):
        # Whole batches from the first: Beam's default grows them from one example (1, 2, 4, ...) to
        # learn a batch's cost, and each small batch paid a whole decode's latency (the quickstart's
        # filter spent 3 of its 6 s of generation on its first 32 prompts). A bundle's remainder still
        # goes out when the bundle ends.
        super().__init__(min_batch_size=spec.batch_size, max_batch_size=spec.batch_size)
        self.spec = spec

    def load_model(self) -> EngineHost:
        enable_compilation_cache(self.spec.compilation_cache_dir, enabled=self.spec.compilation_cache)
        return EngineHost(self.spec.engine, self.spec.model, dtype=self.spec.dtype, tokenizer=self.spec.tokenizer)

    def run_inference(self, batch: Sequence[dict], model: EngineHost,
                      inference_args: dict[str, Any] | None = None) -> Iterable[dict]:
        return model.complete(batch, self.spec)

    def get_num_bytes(self, batch: Sequence[dict]) -> int:
        return sum(len(example["prompt"].encode("utf-8")) for example in batch)

    def get_metrics_namespace(self) -> str:
        return "rlax_engine"


class _VerifyFn(beam.DoFn):
    """Samples -> per-prompt verdicts: ``correct`` and canonical ``answers`` per sample."""

    def __init__(self, rewards=None, task_terms: Mapping[str, str] | None = None):
        self._rewards, self._task_terms = rewards, dict(task_terms or {})

    def setup(self):
        from rlax_core.eval.verify import TASK_TERMS, Verifier

        # The Verifier's Rewarders import the config's own reward modules in this worker.
        self._verifier = Verifier({**TASK_TERMS, **self._task_terms}, rewards=self._rewards)

    def process(self, result):
        verdicts = self._verifier.verify(result["example"], result["texts"], result["finish_reasons"], result["lengths"])
        yield {**result, "correct": [v.correct for v in verdicts], "answers": [v.answer for v in verdicts]}

    def teardown(self):
        self._verifier.close()


class SampleAndVerify(beam.PTransform):
    """Example rows -> ``{example, model, texts, lengths, finish_reasons, correct, answers, skipped}``."""

    def __init__(self, spec: GenerationSpec, rewards=None, task_terms: Mapping[str, str] | None = None):
        """``rewards``: a RewardConfig whose ``modules`` / ``functions`` (a user's own terms) and verifier
        settings the verdicts use; ``task_terms``: task -> the term whose ``pass`` is the verdict, over
        ``rlax_core.eval.verify.TASK_TERMS``."""
        super().__init__()
        self.spec, self.rewards, self.task_terms = spec, rewards, task_terms

    def expand(self, examples):
        return (
            examples
            | "Generate" >> RunInference(EngineModelHandler(self.spec))
            | "Verify" >> beam.ParDo(_VerifyFn(self.rewards, self.task_terms))
        )
