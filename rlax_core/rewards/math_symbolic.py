"""math-verify's equivalence, as the math verifier's worker processes run it.

Only the pool's workers call ``symbolic_equal`` (``rlax_core.rewards.math_verifier`` hands it to them
with a hard timeout); math-verify and sympy are imported on the first call, so the caller that only
names this function never loads them.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=4096)  # a group's samples share one gold answer
def parse_answer(answer: str, seconds: int | None):
    from math_verify import parse

    # Wrapping in \boxed{} makes math-verify read bare LaTeX (\frac12, intervals, sets) as the answer.
    return parse(answer if "\\boxed" in answer else f"\\boxed{{{answer}}}", parsing_timeout=seconds)  # type: ignore[arg-type]


def symbolic_equal(gold: str, prediction: str, seconds: int | None) -> bool:
    """math-verify's verdict; ``seconds`` arms its own alarms (None: none, the pool's kill is the bound)."""
    from math_verify import verify

    parsed_gold, parsed_prediction = parse_answer(gold, seconds), parse_answer(prediction, seconds)
    if not parsed_gold or not parsed_prediction:
        return False
    return bool(verify(parsed_gold, parsed_prediction, timeout_seconds=seconds))
