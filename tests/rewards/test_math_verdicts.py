"""Math verdicts a policy could exploit or be wronged by: tolerance, units, magnitude words, separators, timeouts."""

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from rlax_core.rewards.math_verifier import MathVerifier, MathVerifierConfig, plain_number
from rlax_core.rewards.quantities import read_quantity, word_that_is_no_unit

REPO = Path(__file__).resolve().parents[2]

EQUAL = [
    # thousands separators: comma, space, thin and no-break spaces, LaTeX spaces, {,}
    ("10000", "10 000"), ("1000", "1\\,000"), ("1000000", "1\\;000\\;000"), ("1000", "1{,}000"),
    ("2500", "2\u2009500"), ("2500", "2\u00a0500"), ("1234567", "1 234 567"), ("1000", "1\\!000"),
    # degrees, however written
    ("90", "90°"), ("90", "90^\\circ"), ("90", "90^{\\circ}"), ("90^\\circ", "90 degrees"), ("45", "45^{\\circ}"),
    # magnitude words scale
    ("18000", "18 thousand"), ("2500000", "2.5 million"), ("1200", "1.2 \\text{ thousand}"), ("36", "3 dozen"),
    ("$18,000", "18 thousand dollars"),
    # percent: its number, or its number / 100
    ("0.1", "10%"), ("10", "10 percent"), ("0.25", "25\\%"), ("25", "25 per cent"),
    # units that are units
    ("5", "5 \\text{ m}"), ("72", "72 km/h"), ("3", "3 square feet"), ("3", "3 ft^2"), ("18", "$18.00 per week"),
    ("20", "20°C"), ("7", "7 \\mathrm{kg}"),
    # tolerance relative to the gold
    ("\\frac{1}{3}", "0.333333"), ("\\frac{1}{7}", "0.142857"), ("\\sqrt{2}", "1.414214"),
    ("0.0000005", "5\\times10^{-7}"), ("2.5", "2.5000001"), ("1234.5", "1234.5000001"),
    # an integer gold: exactly, however it is written
    ("12345678", "12345678.0"), ("1000000", "1000000.000"),
]

NOT_EQUAL = [
    # a tolerance relative to the gold's size: 0 is no 0.0000005
    ("0.0000005", "0"), ("0.0000005", "0.0"), ("5\\times10^{-7}", "0.0"), ("5\\times10^{-7}", "0"),
    ("\\frac{1}{3000000}", "0.0"), ("\\sqrt{2}", "1.41421"), ("\\frac{1}{3}", "0.333"),
    # exact numbers compare exactly
    ("12345678", "12345679"), ("1000000", "1000001"),
    # an integer gold takes no tolerance: N+1 and a non-integer near N are not N
    ("12345678", "12345679.0"), ("1000000", "1000000.9"), ("1234", "1234.0000001"), ("123456789", "123456789.0001"),
    ("12345678", "1.2345679\\times10^{7}"), ("3", "2.9999999"),
    # magnitude words are never dropped
    ("18", "18 thousand"), ("18", "18 \\text{ thousand}"), ("18", "18 million"), ("\\frac{1}{2}", "\\frac12 million"),
    ("18", "18 dozen"),
    # a trailing word counts only when it is a unit
    ("18", "18 apples"), ("18", "18 less"), ("18", "18 \\text{ eggs}"), ("18", "18 more"),
    # different units are different answers
    ("5 \\text{ cm}", "5 \\text{ m}"), ("3 hours", "3 minutes"),
    # separators only between groups of three digits
    ("1000", "1,00,0"), ("1000000", "1,000 000"),
]


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(MathVerifierConfig(workers=2, timeout_seconds=30.0)) as verifier:
        yield verifier


def test_equal_answers(verifier):
    results = verifier.compare_many(EQUAL)
    assert [(pair, r) for pair, r in zip(EQUAL, results) if not r.equal] == []


def test_different_answers(verifier):
    results = verifier.compare_many(NOT_EQUAL)
    assert [(pair, r) for pair, r in zip(NOT_EQUAL, results) if r.equal or r.reason != "not_equal"] == []


def test_quantities_read_their_value_unit_and_scale():
    quantity = read_quantity("$1\\,250.50 thousand per week")
    assert quantity.value == Fraction(1250500) and quantity.unit == "dollar / week" and quantity.scaled
    assert read_quantity("90^{\\circ}").unit == read_quantity("90 degrees").unit == "degree"
    assert read_quantity("3 ft^2").unit == read_quantity("3 square feet").unit == "sq foot"
    assert read_quantity("5 m") is None  # outside \text{} a lone letter may be a variable
    assert read_quantity("18 apples") is None and word_that_is_no_unit("18 apples") == "apples"
    assert word_that_is_no_unit("5x") is None  # a product, not a number and a word
    assert plain_number("10 000") == 10000.0 and plain_number("1{,}000.5") == 1000.5
    assert plain_number("18 thousand") is None and plain_number("18 dollars") is None and plain_number("10%") is None


def test_a_timeout_inside_a_worker_is_reported_as_a_timeout_and_scores_zero():
    # sympy's simplification of this runs for many seconds in Python code: the worker's own timer
    # (half the hard limit) ends it, and the verdict says "timeout", not "not_equal". It scores 0 all
    # the same: paying for answers too costly to check would teach a policy to write them.
    from rlax_core.rewards import MathVerifierConfig, RewardConfig, Rewarder

    example = {"id": "t", "task": "math", "answer": "1"}
    config = RewardConfig(terms={"task": 1.0}, math=MathVerifierConfig(timeout_seconds=2.0))
    with Rewarder(config) as rewarder:
        assert rewarder(example, "\\boxed{1}").score == 1.0  # exact: no pool needed
        assert rewarder(example, "\\boxed{\\frac{2}{2}}").score == 1.0  # the pool is up before the timed call
        result = rewarder(example, "\\boxed{\\sin(x)^{300} + \\cos(x)^{300}}")
    term = result.info["terms"]["task"]
    assert (result.score, result.info["pass"], term["reason"]) == (0.0, False, "timeout")


def test_math_workers_start_without_math_verify_warnings():
    code = ("from rlax_core.rewards.math_verifier import MathVerifier\n"
            "with MathVerifier() as v:\n"
            "    assert v.compare('x^2 + 2x + 1', '(x+1)^2').equal\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Timeout is disabled" not in result.stderr and "Timeout during" not in result.stderr, result.stderr[-2000:]


def test_the_last_number_keeps_its_thousands_separators():
    from rlax_core.rewards.answers import extract_answer

    assert extract_answer("so it costs 1\\,000 in total").text == "1\\,000"
    assert extract_answer("we get 12{,}345.5 people").text == "12{,}345.5"
    assert extract_answer("a total of 10\u2009000").text == "10\u2009000"
    assert extract_answer("ages 3 and 100").text == "100"  # a plain space separates numbers in prose


def test_math_equal_works_at_a_scripts_top_level(tmp_path):
    # No ``if __name__ == "__main__":`` guard: the pool's workers must not run the script again.
    script = tmp_path / "check.py"
    script.write_text("from rlax_core.rewards import math_equal\nprint('equal', math_equal('\\\\frac{1}{2}', '0.5'))\n")
    result = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and result.stdout.splitlines() == ["equal True"], result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "bootstrapping" not in result.stderr, result.stderr
