"""math-verify's equivalence, as the math verifier's worker processes run it.

Only the pool's workers call :func:`verdict` (``rlax_core.rewards.math_verifier`` hands it to them
with a hard timeout); math-verify and sympy are imported on the first call, so the caller that only
names this function never loads them.

Inside a worker, two answers that both parse to real numbers (``\\frac{1}{3}``, ``0.333333``,
``5\\times10^{-7}``) are compared by the rule quantities follow (``rlax_core.rewards.quantities``):
when either holds a decimal and the gold is not an integer, within ``relative_tolerance`` of the gold's
size (math-verify's own numeric rule rounds to 6 decimals, which takes ``0.0`` for a gold
``5\\times10^{-7}``); an integer gold and two rationals exactly. Exact irrationals (``3\\sqrt{3}``)
and everything else go to math-verify's symbolic comparison.

Time: one interval timer per comparison (``seconds``), set here rather than math-verify's alarms,
which end a parse or a comparison in a silent "no answer" / "not equal" indistinguishable from a
wrong answer. math-verify is told it has no timeout (``None``), and so that it does not warn about
that in every worker, its once-per-process warning is marked as given: the timer and the pool's hard
kill are the bound it asks its caller to provide.
"""

from __future__ import annotations

import functools
import signal
from fractions import Fraction

from rlax_core.rewards.quantities import numbers_equal


class SoftTimeout(BaseException):
    """Raised by the worker's interval timer; a BaseException, so no ``except Exception`` on the way swallows it."""


def _on_timer(signum, frame):
    raise SoftTimeout


@functools.lru_cache(maxsize=1)
def _math_verify():
    import math_verify
    import math_verify.grader
    import math_verify.parser

    # "Timeout is disabled ... you must provide the logic for timeout interruption yourself": we do.
    math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@functools.lru_cache(maxsize=4096)  # a group's samples share one gold answer
def parse_answer(answer: str):
    # Wrapping in \boxed{} makes math-verify read bare LaTeX (\frac12, intervals, sets) as the answer.
    return _math_verify().parse(answer if "\\boxed" in answer else f"\\boxed{{{answer}}}", parsing_timeout=None)


def _real_number(parsed):
    """The first parsed expression when it is a real number (no symbols, sets or relations), else None."""
    import sympy

    expr = next((e for e in parsed if isinstance(e, sympy.Expr)), None)
    if expr is None or not expr.is_number or expr.has(sympy.UnevaluatedExpr):  # percent: math-verify's rules
        return None
    return expr


def _as_value(expr):
    """A Fraction for a rational or a decimal as written; else a 50-digit Float (None: not real and finite)."""
    import sympy

    if expr.is_Rational:
        return Fraction(int(expr.p), int(expr.q))
    if expr.is_Float:
        return Fraction(str(expr))  # the decimal as written, not its binary rounding
    value = expr.evalf(50)
    return value if value.is_Float and value.is_finite else None


def _within(gold, prediction, relative_tolerance: float) -> bool:
    tolerance = Fraction(str(relative_tolerance))
    if isinstance(gold, Fraction) and isinstance(prediction, Fraction):
        return numbers_equal(gold, prediction, tolerance)
    import sympy

    integer_gold = isinstance(gold, Fraction) and gold.denominator == 1
    gold, prediction = (sympy.Rational(x.numerator, x.denominator) if isinstance(x, Fraction) else x
                        for x in (gold, prediction))
    if integer_gold:  # compared exactly, as numbers_equal does
        return bool(abs(prediction - gold) == 0)
    return bool(abs(prediction - gold) <= sympy.Rational(tolerance.numerator, tolerance.denominator) * abs(gold))


def _compare(gold: str, prediction: str, relative_tolerance: float) -> str:
    import sympy

    parsed_gold, parsed_prediction = parse_answer(gold), parse_answer(prediction)
    if not parsed_gold or not parsed_prediction:
        return "not_equal"
    numbers = _real_number(parsed_gold), _real_number(parsed_prediction)
    if numbers[0] is not None and numbers[1] is not None:
        if any(n.atoms(sympy.Float) for n in numbers):  # a decimal was written: equal within the tolerance
            values = [_as_value(n) for n in numbers]
            if None not in values:
                return "numeric" if _within(*values, relative_tolerance) else "not_equal"
        elif all(n.is_Rational for n in numbers):
            return "numeric" if numbers[0] == numbers[1] else "not_equal"
        # Exact numbers that are not plain rationals (3\sqrt{3}, 9^{9^9}): equal only if equal exactly.
    return "symbolic" if _math_verify().verify(parsed_gold, parsed_prediction, timeout_seconds=None) else "not_equal"


def verdict(gold: str, prediction: str, seconds: float | None, relative_tolerance: float = 1e-6) -> str:
    """``symbolic``, ``numeric``, ``not_equal``, or ``timeout`` when ``seconds`` ran out first (main thread only)."""
    if not seconds:
        return _compare(gold, prediction, relative_tolerance)
    previous = signal.signal(signal.SIGALRM, _on_timer)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return _compare(gold, prediction, relative_tolerance)
    except SoftTimeout:
        return "timeout"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
