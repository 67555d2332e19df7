"""The code verdict as a test running in-process would give it, or no pass: large suites, aliasing, timeouts.

Each check runs the real program and judge sandboxes (``code_verifier.run_tests``).
"""

import pytest

from rlax_core.rewards import CodeTests, run_tests
from rlax_core.sandbox.run import SandboxLimits
from rlax_core.rewards.code_verifier import build_program

LIMITS = SandboxLimits(cpu_seconds=10, wall_seconds=20.0, memory_bytes=256 << 20, file_bytes=4 << 20,
                       workdir_bytes=8 << 20)


def test_an_honest_program_passes_3000_asserts():
    # Before the channel was sized by the test count, verdicts after ~1,330 were cut off: "crashed exit code 0".
    tests = CodeTests(cases=tuple(f"assert f({i}) == {i * i}" for i in range(3000)))
    result = run_tests("def f(x):\n    return x * x\n", tests, LIMITS, per_test_seconds=2.0)
    assert result.all_passed, [v for v in result.verdicts if not v.passed][:3]
    assert len(result.verdicts) == 3000


def _verdicts(program: str, cases, per_test_seconds=2.0):
    result = run_tests(program, CodeTests(cases=tuple(cases)), LIMITS, per_test_seconds=per_test_seconds)
    return [(v.reason, v.detail) for v in result.verdicts]


SORTS_IN_PLACE = "def f(xs):\n    xs.sort()\n"
RETURNS_ITS_ARGUMENT = "def f(xs):\n    xs.append(0)\n    return xs\n"
PURE = "def f(xs):\n    return sorted(xs)\n"


@pytest.mark.parametrize("program, test, in_process", [
    # A test that checks the argument after the call sees what the program did to it, as in-process.
    (SORTS_IN_PLACE, "xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]", "passed"),
    (SORTS_IN_PLACE, "xs = [3, 1, 2]\nf(xs)\nassert xs == [3, 1, 2], 'the argument changed'", "failed"),
    (PURE, "xs = [3, 1, 2]\nassert f(xs) == [1, 2, 3] and xs == [3, 1, 2]", "passed"),
    # Nested containers keep their identity; a dict and a set argument change in place.
    ("def f(grid):\n    grid[0].append(9)\n", "row = [1]\ngrid = [row]\nf(grid)\nassert row == [1, 9]", "passed"),
    ("def f(d, s):\n    d['k'] = 1\n    del d['gone']\n    s.add(2)\n",
     "d, s = {'gone': 0}, {1}\nf(d, s=s)\nassert d == {'k': 1} and s == {1, 2}", "passed"),
    # The result is the argument itself: identity and later changes through it, as in-process.
    (RETURNS_ITS_ARGUMENT, "xs = [1]\nys = f(xs)\nassert ys is xs and xs == [1, 0]", "passed"),
    (RETURNS_ITS_ARGUMENT, "xs = [1]\nys = f(xs)\nys.append(5)\nassert xs == [1, 0], 'aliased'", "failed"),
    (RETURNS_ITS_ARGUMENT, "xs = [1]\nassert f(xs) is not xs, 'the same list came back'", "failed"),
    # An argument inside the result, or put inside another argument, is the test's own object too.
    ("def f(xs):\n    return (xs, len(xs))\n", "xs = [1]\nr = f(xs)\nassert r[0] is xs and r[1] == 1", "passed"),
    ("def f(xs):\n    return [xs]\n", "xs = [1]\nf(xs)[0].append(2)\nassert xs == [1], 'aliased'", "failed"),
    ("def f(a, b):\n    a.append(b)\n", "a, b = [], [1]\nf(a, b)\nb.append(2)\nassert a == [[1, 2]]", "passed"),
    # A program that changes its argument and then raises: the change still happened.
    ("def f(xs):\n    xs.clear()\n    raise ValueError('no')\n",
     "xs = [1]\ntry:\n    f(xs)\nexcept ValueError:\n    pass\nassert xs == []", "passed"),
], ids=["sorts_in_place", "mutation_seen", "pure_leaves_argument", "nested_identity", "dict_and_set_kwarg",
        "returns_argument", "alias_then_append", "identity_checked", "argument_in_result", "alias_in_result",
        "argument_into_argument", "mutates_then_raises"])
def test_arguments_and_results_are_seen_as_in_process(program, test, in_process):
    assert [reason for reason, _ in _verdicts(program, [test])] == [in_process]


LOOPS = "def f(x):\n    while True:\n        pass\n"


@pytest.mark.parametrize("program, test", [
    # The program exports BaseException under a name the test catches: the judge's timeout is not the program's.
    (LOOPS + "Oops = BaseException\n", "try:\n    f(1)\nexcept Oops:\n    pass"),
    # A test that catches everything still cannot turn the judge's timeout into a pass.
    (LOOPS, "try:\n    f(1)\nexcept BaseException:\n    pass"),
    # ...nor keep running after catching it: the alarm fires again.
    (LOOPS, "while True:\n    try:\n        f(1)\n    except BaseException:\n        pass"),
])
def test_a_caught_timeout_is_still_a_timeout(program, test):
    (reason, detail), after = _verdicts(program, [test, "assert True"], per_test_seconds=1.0)
    assert reason == "timeout", detail
    if "while True" in test:
        # Still running when the alarm fires again: the judge ends there, with the verdict of that test
        # and the rest not run (it raised into such a loop before, and CPython once ended with
        # "SystemError: error return without exception set", a crash instead of a verdict).
        assert after[0] == "error" and after[1].startswith("not run: test 0 caught the judge's timeout"), after
    else:
        assert after[0] == "passed", after


def test_a_caught_channel_limit_does_not_pass():
    program = "def f(x):\n    return object()\n"  # a handle: no attributes here
    reason, detail = _verdicts(program, ["try:\n    f(1).value\nexcept AttributeError:\n    pass"])[0]
    assert reason == "error" and "not plain data" in detail, detail


def test_a_reference_decodes_only_to_an_argument_of_the_call():
    from rlax_core.rewards import plain_data

    mine = [1]
    assert plain_data.from_wire({"$": "ref", "v": ["arg", 0]}, None, lambda tag: {("arg", 0): mine}[tuple(tag)]) is mine
    for forged, refs in [({"$": "ref", "v": ["arg", 0]}, None),  # no call to refer to (a name lookup)
                         ({"$": "ref", "v": ["arg", 7]}, lambda tag: {("arg", 0): mine}[tuple(tag)]),
                         ({"$": "ref", "v": 3}, lambda tag: {("arg", 0): mine}[tuple(tag)])]:
        with pytest.raises(plain_data.BadWireData):
            plain_data.from_wire(forged, None, refs)
