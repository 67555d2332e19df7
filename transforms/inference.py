"""Sampling completions with the RLAX engine inside Beam's RunInference, and verifying them.

:class:`EngineModelHandler` is a RunInference ``ModelHandler``: RunInference loads the model once per
worker process (through ``apache_beam.utils.shared``) and every DoFn thread of that process uses it;
it batches examples (``batch_size`` prompts per engine call) and the engine decodes the samples of a
batch together with continuous batching. Samples are keyed by (seed, example id, sample index), so
the same example gets the same samples whatever batch or worker it lands in.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, RunInference

from rlax_core.inference.config import GenerationSpec

logger = logging.getLogger(__name__)


class LoadedEngine:
    """What one worker process holds: the engine over the loaded weights, and the tokenizer."""

    def __init__(self, spec: GenerationSpec):
        if not spec.model:
            raise ValueError("GenerationSpec.model is empty: name the checkpoint to sample")

        from rlax_core.utils.devices import use_cpu_cores_as_devices

        if spec.engine.replicas != 1:
            use_cpu_cores_as_devices()  # on a CPU worker, a replica per core (if JAX has not started yet)
        from rlax_core.inference.replicas import ReplicatedEngine
        from rlax_core.models.tokenizer import load_tokenizer
        from rlax_core.training.policy_source import load_policy, tokenizer_path

        self.spec = spec
        self.tokenizer = load_tokenizer(spec.tokenizer or tokenizer_path(spec.model))
        model = load_policy(spec.model, dtype=spec.dtype)
        self.engine = ReplicatedEngine(spec.engine, model.config, model.params, detokenize=self.tokenizer.decode)
        self.lock = threading.Lock()  # the engine is not re-entrant; RunInference threads share it

    def prompt_ids(self, example: Mapping[str, Any]) -> list[int]:
        from rlax_core.tasks.prompts import prompt_ids

        return prompt_ids(example, self.tokenizer)  # the task's format, as rollouts use it

    def complete(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every example with its samples: texts, token lengths and finish reasons (or why it was skipped)."""
        from rlax_core.inference.engine import Request

        sampling = self.spec.sampling()
        results, requests = [], []
        for example in examples:
            ids = self.prompt_ids(example)
            result = {"example": dict(example), "model": self.spec.label, "texts": [], "lengths": [],
                      "finish_reasons": [], "skipped": None}
            if len(ids) > self.spec.engine.max_prompt_len:
                result["skipped"] = f"prompt of {len(ids)} tokens exceeds max_prompt_len={self.spec.engine.max_prompt_len}"
            else:
                requests.append(Request(ids, sampling, prompt_id=example["id"], seed=self.spec.seed))
            results.append(result)
        started = time.monotonic()
        with self.lock:
            completions = self.engine.generate(requests) if requests else []
        logger.info("%s: %d prompt(s) x %d sample(s), %d tokens in %.1f s", self.spec.label, len(requests),
                    sampling.n, sum(len(c.completion_ids) for c in completions), time.monotonic() - started)
        by_id = {r["example"]["id"]: r for r in results}
        for completion in completions:  # in request order, then sample index
            result = by_id[completion.prompt_id]
            result["texts"].append(self.tokenizer.decode(completion.completion_ids, skip_special_tokens=True))
            result["lengths"].append(len(completion.completion_ids))
            result["finish_reasons"].append(completion.finish_reason)
        return results


class EngineModelHandler(ModelHandler[dict, dict, LoadedEngine]):
    """RunInference handler: Example rows in, ``{example, model, texts, lengths, finish_reasons}`` out."""

    def __init__(self, spec: GenerationSpec):
        super().__init__(min_batch_size=1, max_batch_size=spec.batch_size)
        self.spec = spec

    def load_model(self) -> LoadedEngine:
        return LoadedEngine(self.spec)

    def run_inference(self, batch: Sequence[dict], model: LoadedEngine,
                      inference_args: dict[str, Any] | None = None) -> Iterable[dict]:
        return model.complete(batch)

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
