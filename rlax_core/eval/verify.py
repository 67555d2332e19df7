"""One verdict per sampled completion: is it correct, and which answer did it give (for majority votes).

Correctness comes from the reward terms of ``rlax_core.rewards`` (one place decides what "correct"
means for training and for evaluation): ``math`` and ``code`` examples by the ``task`` term (math
answers by the math verifier, programs by their tests), ``story`` examples by ``story_word``. A
term's ``pass`` is the verdict; the math term's extracted answer is the vote for maj@k.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

# Example task -> the reward term whose ``pass`` decides correctness.
TASK_TERMS = {"math": "task", "code": "task", "sql": "sql", "story": "story_word"}


@dataclasses.dataclass(frozen=True)
class Verdict:
    correct: bool
    answer: str | None  # canonical extracted answer; None when there is none or the task has none


def canonical_answer(text: str) -> str:
    """The key majority voting groups answers by: numbers by value (``1,000`` = ``1000.0``), else the text without spaces."""
    from rlax_core.rewards.math_verifier import plain_number

    number = plain_number(text)
    return repr(float(number)) if number is not None else "".join(text.split())


class Verifier:
    """Verdicts for the samples of one example; one Rewarder (and its worker pools) per reward term."""

    def __init__(self, task_terms: Mapping[str, str] = TASK_TERMS, rewards: Any | None = None):
        """``rewards``: a ``RewardConfig`` whose verifier settings and own modules / functions
        (``rlax_core.rewards.custom``) the terms are built with; its ``terms`` are not used."""
        self.task_terms = dict(task_terms)
        self.rewards = rewards
        self._rewarders: dict[str, Any] = {}

    def _rewarder(self, task: str):
        from rlax_core.rewards import Rewarder, RewardConfig

        if task not in self.task_terms:
            raise ValueError(f"no verifier for task {task!r}; known tasks: {', '.join(sorted(self.task_terms))}")
        term = self.task_terms[task]
        if term not in self._rewarders:
            base = self.rewards if self.rewards is not None else RewardConfig()
            self._rewarders[term] = Rewarder(dataclasses.replace(base, terms={term: 1.0}))
        return term, self._rewarders[term]

    def verify(self, example: Mapping[str, Any], completions: Sequence[str], finish_reasons: Sequence[str],
               lengths: Sequence[int] | None = None) -> list[Verdict]:
        from rlax_core.rewards import Sample

        term, rewarder = self._rewarder(example["task"])
        lengths = lengths or [None] * len(completions)
        results = rewarder.score_many([Sample(example, text, finish, n)
                                       for text, finish, n in zip(completions, finish_reasons, lengths)])
        verdicts = []
        for result in results:
            extracted = result.info["terms"][term].get("extracted")
            verdicts.append(Verdict(bool(result.info["pass"]), canonical_answer(extracted) if extracted else None))
        return verdicts

    def close(self) -> None:
        for rewarder in self._rewarders.values():
            rewarder.close()
        self._rewarders.clear()
