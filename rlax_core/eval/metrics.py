"""pass@k, maj@k and mean@n of the n samples drawn for one prompt, and their average over prompts.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code", eq. 1): with n samples of which c are correct, the chance that a random k-subset holds at
least one correct sample is ``1 - C(n-c, k) / C(n, k)``. It is computed as a running product so it
stays exact in floating point for large n instead of dividing two huge binomials.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (requires 1 <= k <= n, 0 <= c <= n)."""
    if not (isinstance(n, (int, np.integer)) and isinstance(c, (int, np.integer)) and isinstance(k, (int, np.integer))):
        raise TypeError(f"pass_at_k takes integers, got n={n!r}, c={c!r}, k={k!r}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_at_n(correct: Sequence[bool]) -> float:
    """The fraction of the n samples that are correct (the expected pass@1)."""
    if len(correct) == 0:
        raise ValueError("mean_at_n needs at least one sample")
    return float(np.mean(np.asarray(correct, dtype=np.float64)))


def majority_answer(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent non-null answer; ties go to the one that appeared first (deterministic)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """Majority-vote accuracy over the ``n // k`` disjoint groups of ``k`` consecutive samples.

    ``answers`` are the samples' extracted answers in a canonical form (None: no answer) and
    ``correct`` whether each one is right; a group scores 1 when its majority answer is a correct
    one. Averaging the disjoint groups uses every sample instead of only the first k.
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k: {len(answers)} answers but {len(correct)} correctness flags")
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k needs 1 <= k <= n, got k={k}, n={n}")
    right = {a for a, ok in zip(answers, correct) if ok and a is not None}
    scores = []
    for start in range(0, n - k + 1, k):
        winner = majority_answer(answers[start : start + k])
        scores.append(1.0 if winner is not None and winner in right else 0.0)
    return float(np.mean(scores))


def summarize_prompts(per_prompt: Iterable[Mapping], ks: Sequence[int]) -> dict[str, float]:
    """Average pass@k, maj@k and mean@n over prompts.

    Each item holds ``correct`` (list of bools) and ``answers`` (list of canonical answers); a k
    larger than a prompt's sample count is skipped for that prompt rather than guessed.
    """
    totals: dict[str, list[float]] = {}
    for item in per_prompt:
        correct = list(item["correct"])
        answers = list(item.get("answers") or [None] * len(correct))
        n, c = len(correct), int(sum(bool(x) for x in correct))
        totals.setdefault("mean@n", []).append(mean_at_n(correct))
        for k in ks:
            if k <= n:
                totals.setdefault(f"pass@{k}", []).append(pass_at_k(n, c, k))
                totals.setdefault(f"maj@{k}", []).append(maj_at_k(answers, correct, k))
    return {name: float(np.mean(values)) for name, values in sorted(totals.items())}
