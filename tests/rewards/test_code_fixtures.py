"""Real HumanEval and MBPP rows (tests/rewards/fixtures) through the judge: canonical solutions pass,
wrong ones fail, and the one shape the judge cannot reduce fails closed with its reason."""

import json
import re
from pathlib import Path

import pytest

from rlax_core.rewards.code_verifier import CodeVerifier, humaneval_tests, mbpp_tests

ROWS = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "code_tasks.jsonl").read_text().splitlines()]
# MBPP 126 names its function ``sum``: a test's builtin names are always the builtins (else a program
# could redefine ``sorted`` or ``len`` that a test checks with), so this row cannot pass.
FAILS_CLOSED = {126: "the program defines sum, but sum here is the builtin"}


def _case(row):
    if row["dataset"] == "humaneval":
        return row["canonical_solution"], humaneval_tests(row), "    return None\n"
    name = re.match(r"assert\W*(\w+)\(", row["test_list"][0]).group(1)  # the function the tests call
    return row["code"], mbpp_tests(row), f"{row['code']}\n\ndef {name}(*args, **kwargs):\n    return None\n"


@pytest.fixture(scope="module")
def verdicts():
    cases = [_case(row) for row in ROWS]
    with CodeVerifier(workers=2) as verifier:
        right = verifier.check_many([(solution, tests) for solution, tests, _ in cases])
        wrong = verifier.check_many([(sabotage, tests) for _, tests, sabotage in cases])
    return right, wrong


def test_canonical_solutions_pass_except_the_one_that_fails_closed(verdicts):
    right, _ = verdicts
    for row, result in zip(ROWS, right):
        if row["task_id"] in FAILS_CLOSED:
            assert not result.all_passed and FAILS_CLOSED[row["task_id"]] in result.verdicts[0].detail, result.info()
        else:
            assert result.all_passed, (row["task_id"], result.info())


def test_wrong_solutions_fail(verdicts):
    _, wrong = verdicts
    assert not [row["task_id"] for row, result in zip(ROWS, wrong) if result.all_passed]
