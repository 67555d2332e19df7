"""The built-in reward terms: correctness (math, code, task) and format.

Correctness terms put ``pass`` in their info: the verifiable outcome that pass@k counts.
"""

from __future__ import annotations

import re
from typing import Sequence

from rlax_core.rewards.answers import extract_answer, last_boxed
from rlax_core.rewards.code_verifier import CodeTests, CodeVerifier
from rlax_core.rewards.math_verifier import MathVerifier
from rlax_core.rewards.sql_match import SqlExecutionMatch
from rlax_core.rewards.registry import (SCORER_UNAVAILABLE, RewardResult, RewardTerm, Sample, register_reward,
                                       scoring_failure)


def _field(sample: Sample, name: str):
    value = sample.example.get(name)
    if value is None:
        raise ValueError(f"example {sample.example.get('id', '?')!r} has no {name!r}; the reward needs it")
    return value


@register_reward("math")
class MathAnswer(RewardTerm):
    """1 when the extracted final answer equals the example's ``answer`` (math-verify, hard timeout)."""

    def __init__(self, config):
        super().__init__(config)
        self.verifier = MathVerifier(config.math)

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        golds = [sample.example.get("answer") for sample in samples]
        extracted = [extract_answer(sample.completion, self.config.extraction) for sample in samples]
        pending = [(str(gold), found.text) for gold, found in zip(golds, extracted)
                   if found is not None and gold is not None]
        verdicts = iter(self.verifier.compare_many(pending))
        results = []
        for sample, gold, found in zip(samples, golds, extracted):
            if gold is None:  # this sample's example is malformed: its reward alone is 0
                results.append(scoring_failure(f"example {sample.example.get('id', '?')!r} has no 'answer'"))
            elif found is None:
                results.append(RewardResult(0.0, {"pass": False, "extracted": None, "reason": "no_answer"}))
            else:
                verdict = next(verdicts)
                results.append(RewardResult(float(verdict.equal), {"pass": verdict.equal, "extracted": found.text[:200],
                                                                   "method": found.method, "reason": verdict.reason}))
        return results

    def close(self) -> None:
        self.verifier.close()


@register_reward("code")
class CodeTestsPass(RewardTerm):
    """1 when the completion's program passes every test of the example (``partial_credit``: the fraction)."""

    def __init__(self, config):
        super().__init__(config)
        code = config.code
        self.verifier = CodeVerifier(code.workers, code.limits, code.per_test_seconds)

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        # Each sample on its own: one whose tests do not parse or whose check breaks costs its own
        # reward only, and the others' checks are not run twice.
        checks = []
        for sample in samples:
            try:
                checks.append(self.verifier.submit(sample.completion, CodeTests.from_record(_field(sample, "tests"))))
            except Exception as error:  # noqa: BLE001 - this sample's example is malformed
                checks.append(scoring_failure(f"{type(error).__name__}: {error}"))
        return [self._result(check) for check in checks]

    def _result(self, check) -> RewardResult:
        if isinstance(check, RewardResult):
            return check
        try:
            result = check.result()
        except SCORER_UNAVAILABLE:
            raise
        except Exception as error:  # noqa: BLE001 - the check of this sample broke: its reward alone is 0
            return scoring_failure(f"{type(error).__name__}: {error}")
        score = result.pass_fraction if self.config.code.partial_credit else float(result.all_passed)
        return RewardResult(score, {"pass": result.all_passed, **result.info()})

    def close(self) -> None:
        self.verifier.close()


@register_reward("task")
class ByTask(RewardTerm):
    """Correctness by the example's ``task`` field: ``math``, ``code`` or ``sql``, so one run can mix them."""

    def __init__(self, config):
        super().__init__(config)
        self._terms: dict[str, RewardTerm] = {}  # built on first use: a math-only run starts no sandbox pool

    def _term(self, task: str) -> RewardTerm:
        terms = {"math": MathAnswer, "code": CodeTestsPass, "sql": SqlExecutionMatch}
        if task not in terms:
            raise ValueError(f"the 'task' reward scores math, code and sql examples, got task {task!r}")
        if task not in self._terms:
            self._terms[task] = terms[task](self.config)
        return self._terms[task]

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(samples)
        by_task: dict[str, list[int]] = {}
        for index, sample in enumerate(samples):
            try:
                task = str(_field(sample, "task"))
                self._term(task)
            except ValueError as error:  # this sample's example names no task this term scores
                results[index] = scoring_failure(str(error))
                continue
            by_task.setdefault(task, []).append(index)
        for task, indices in by_task.items():
            for index, result in zip(indices, self._term(task).score_many([samples[i] for i in indices])):
                results[index] = result
        return results  # type: ignore[return-value]

    def close(self) -> None:
        for term in self._terms.values():
            term.close()


@register_reward("format_boxed")
class BoxedAnswer(RewardTerm):
    """1 when the completion ends its reasoning with exactly one complete ``\\boxed{...}`` answer."""

    def score(self, sample: Sample) -> RewardResult:
        count = sample.completion.count("\\boxed")
        ok = count == 1 and bool((last_boxed(sample.completion) or "").strip())
        return RewardResult(float(ok), {"matched": ok, "boxed_count": count})


@register_reward("format_think")
class ThinkThenAnswer(RewardTerm):
    """1 for ``<think>reasoning</think> answer``: one think block, reasoning inside, an answer after it."""

    def score(self, sample: Sample) -> RewardResult:
        tags = self.config.format
        text = sample.completion
        single = text.count(tags.think_open) == 1 and text.count(tags.think_close) == 1
        ok = False
        if single:
            before, _, rest = text.partition(tags.think_open)
            reasoning, _, answer = rest.partition(tags.think_close)
            ok = not before.strip() and bool(reasoning.strip()) and bool(answer.strip())
        return RewardResult(float(ok), {"matched": ok})


_FENCED_PYTHON = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n.*?```", re.DOTALL | re.IGNORECASE)


@register_reward("format_code_block")
class FencedCode(RewardTerm):
    """1 when the completion holds a fenced Python code block (what the code verifier runs)."""

    def score(self, sample: Sample) -> RewardResult:
        ok = _FENCED_PYTHON.search(sample.completion) is not None
        return RewardResult(float(ok), {"matched": ok})
