"""Every parse of model text in the scorer's process stays linear on degenerate completions.

The inputs and scorers are ``benchmarks/host_parsing.py``'s (which measures them against a linear scan
and a per-sample budget). The bound here is generous, for a loaded machine: at this size the
backtracking patterns of before issue 30 took over 10 s on ``newlines`` and ``fence_then_blanks``.
"""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import host_parsing  # noqa: E402

CHARS = 160_000
BOUND_S = 1.0
INPUTS = host_parsing.pathological(CHARS)
SCORERS = host_parsing.host_scorers()


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_host_side_scorers_stay_linear_on_a_pathological_completion(name):
    text = INPUTS[name]
    for scorer_name, scorer in SCORERS.items():
        start = time.process_time()
        scorer(text)
        seconds = time.process_time() - start
        assert seconds < BOUND_S, f"{scorer_name} took {seconds:.2f} s on {len(text)} chars of {name}"


def test_build_program_still_finds_the_entry_point():
    from rlax_core.rewards.code_verifier import CodeTests, build_program, extract_code

    tests = CodeTests(cases=("check(f)",), prompt="import math\ndef f(x):\n", entry_point="f")
    indented = "```python\n  def f (x):\n    return x\n```"
    assert build_program(indented, tests) == "import math\n  def f (x):\n    return x\n"
    assert build_program("    return x\n", tests) == "import math\ndef f(x):\n    return x\n"
    assert build_program("\n" * 1000 + "def f(x):\n    return 1\n", tests).startswith("import math\n\n")
    assert extract_code("```py  \nA\n```\n```Python3\t\nB\n```") == "B\n"
    assert extract_code("``` python\nC\n```") == "C\n"
