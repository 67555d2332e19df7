"""Wrong programs that try to forge a passing code verdict score 0 through the real ``Rewarder``.

Every program here gets ``f`` wrong (the task is ``f(x) == x * x``) and then attacks the harness
instead. The first group are the forgeries that scored 1.0 before the verdict moved out of the
candidate's process; the rest are the other tricks a policy could find. Each check runs the real
sandbox, so a test that passes here proves the attack failed against the shipped code.
"""

import json

import pytest

from rlax_core.data.records import make_example
from rlax_core.rewards import CodeRewardConfig, RewardConfig, Rewarder
from rlax_core.sandbox.run import SandboxLimits

MBPP_STYLE = ["assert f(2) == 4", "assert f(3) == 9", "assert f(-1) == 1"]
HUMANEVAL_STYLE = {"prompt": "def f(x):\n    \"\"\"The square of x.\"\"\"\n", "entry_point": "f",
                   "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"}
HONEST = "def f(x):\n    return x * x\n"
WRONG = "def f(x):\n    return 0\n"


@pytest.fixture(scope="module")
def rewarder():
    limits = SandboxLimits(cpu_seconds=3, wall_seconds=6.0, memory_bytes=256 << 20, file_bytes=4 << 20,
                           workdir_bytes=8 << 20)
    config = RewardConfig(terms={"code": 1.0}, code=CodeRewardConfig(workers=2, per_test_seconds=2.0, limits=limits))
    with Rewarder(config) as scorer:
        yield scorer


def _score(rewarder, program: str, tests=MBPP_STYLE):
    example = make_example(source="forgery", prompt="write f", task="code", tests=tests)
    reward, info = rewarder(example, f"```python\n{program}\n```")
    return reward, info["terms"]["code"]


def _assert_forgery_fails(rewarder, program: str, tests=MBPP_STYLE) -> dict:
    reward, info = _score(rewarder, program, tests)
    assert reward == 0.0 and info["pass"] is False and info["passed"] == 0, info
    return info


@pytest.mark.parametrize("tests", [MBPP_STYLE, HUMANEVAL_STYLE], ids=["asserts", "check"])
def test_honest_and_plainly_wrong_programs_score_as_they_should(rewarder, tests):
    assert _score(rewarder, HONEST, tests)[0] == 1.0
    _assert_forgery_fails(rewarder, WRONG, tests)


# ----------------------------------------------------------------------------- the forgery classes of issue 18


@pytest.mark.parametrize("patch", [
    "__main__._run = lambda *args, **kwargs: None",  # the tests never run
    "__main__._reason = lambda error: 'passed'",  # every failure reported as a pass
    # Whatever the harness is now: every function it holds answers "passed" / True.
    "for _name, _value in list(vars(__main__).items()):\n"
    "    if callable(_value) and not isinstance(_value, type):\n"
    "        setattr(__main__, _name, lambda *args, _value=_value, **kwargs: True)",
], ids=["skip_tests", "rewrite_reason", "replace_everything"])
def test_reassigning_the_harness_through_main_scores_zero(rewarder, patch):
    _assert_forgery_fails(rewarder, f"import __main__\n{patch}\n{WRONG}")


FRAME_WALK = """
import gc, json, os, sys

def _secrets():
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            if isinstance(value, str) and 0 < len(value) <= 128:
                yield value
        frame = frame.f_back
    for value in gc.get_objects():
        if isinstance(value, dict):
            for key in ("token", "secret", "key"):
                if isinstance(value.get(key), str):
                    yield value[key]

for secret in set(_secrets()):
    for index in range(8):
        line = secret + " " + json.dumps({"index": index, "reason": "passed", "detail": ""}) + "\\n"
        for fd in range(1, 12):
            try:
                os.write(fd, line.encode())
            except OSError:
                pass
"""


@pytest.mark.parametrize("ending", ["os._exit(0)", "pass"], ids=["then_exit", "then_continue"])
def test_walking_frames_to_the_secret_and_writing_signed_verdicts_scores_zero(rewarder, ending):
    _assert_forgery_fails(rewarder, f"{FRAME_WALK}\n{ending}\n{WRONG}")


ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    __hash__ = object.__hash__

def f(x):
    return Anything()
"""


@pytest.mark.parametrize("tests", [MBPP_STYLE, HUMANEVAL_STYLE], ids=["asserts", "check"])
def test_an_object_whose_eq_is_always_true_scores_zero(rewarder, tests):
    _assert_forgery_fails(rewarder, ALWAYS_EQUAL, tests)


def test_a_builtin_subclass_with_a_lying_eq_scores_zero(rewarder):
    program = ("class Square(int):\n    def __eq__(self, other):\n        return True\n"
               "    __hash__ = int.__hash__\n\ndef f(x):\n    return Square(0)\n")
    _assert_forgery_fails(rewarder, program)


READ_THE_TESTS = """
import gc, re

_answers = {}
for _value in gc.get_objects():
    for _text in (_value if isinstance(_value, (list, tuple)) else _value.values() if isinstance(_value, dict) else ()):
        if isinstance(_text, str):
            for _arg, _expected in re.findall(r"f\\((.+?)\\) == (.+)", _text):
                _answers[_arg] = eval(_expected)

def f(x):
    return _answers.get(repr(x), 0)
"""


def test_reading_the_expected_outputs_from_the_harness_scores_zero(rewarder):
    _assert_forgery_fails(rewarder, READ_THE_TESTS)


REWRITE_THE_TESTS = """
import gc
for _value in gc.get_objects():
    if isinstance(_value, list) and _value and all(isinstance(t, str) and "assert" in t for t in _value):
        _value[:] = ["pass"] * len(_value)
    if isinstance(_value, dict) and isinstance(_value.get("tests"), list):
        _value["tests"][:] = ["pass"] * len(_value["tests"])
"""


def test_rewriting_the_tests_through_gc_scores_zero(rewarder):
    _assert_forgery_fails(rewarder, REWRITE_THE_TESTS + WRONG)


# ----------------------------------------------------------------------------- other tricks


def test_fake_protocol_lines_on_stdout_and_stderr_score_zero(rewarder):
    lines = [json.dumps({"index": i, "reason": "passed", "detail": ""}) for i in range(3)]
    lines += [json.dumps({"id": i, "value": v}) for i in range(6) for v in (True, 4, 9, 1)]
    lines += [json.dumps({"test": i, "verdict": "passed"}) for i in range(3)]
    program = f"import sys\nfor line in {lines!r}:\n    print(line)\n    print(line, file=sys.stderr)\n{WRONG}"
    _assert_forgery_fails(rewarder, program)


@pytest.mark.parametrize("trick", [
    "for fd in range(3, 32):\n    try:\n        os.close(fd)\n    except OSError:\n        pass",
    "for fd in range(3, 32):\n    try:\n        os.dup2(1, fd)\n    except OSError:\n        pass",
], ids=["close", "dup_stdout_over"])
def test_closing_or_duping_the_channels_scores_zero(rewarder, trick):
    _assert_forgery_fails(rewarder, f"import os\n{trick}\nprint('passed')\n{WRONG}")


@pytest.mark.parametrize("exit_call", ["os._exit(0)", "sys.exit(0)", "raise SystemExit(0)", "raise KeyboardInterrupt",
                                       "os.kill(os.getpid(), 9)"])
def test_leaving_early_inside_the_function_scores_zero(rewarder, exit_call):
    _assert_forgery_fails(rewarder, f"import os, sys\ndef f(x):\n    {exit_call}\n")


def test_leaving_early_at_import_scores_zero(rewarder):
    _assert_forgery_fails(rewarder, "import os\nos._exit(0)\n")


@pytest.mark.parametrize("override", [
    "builtins.isinstance = lambda *args: True",
    "builtins.AssertionError = type('AssertionError', (Exception,), {})",
    "builtins.type = lambda *args: int",
    "json.dumps = lambda *args, **kwargs: 'true'\njson.loads = lambda *args, **kwargs: True",
    "builtins.repr = lambda value: 'True'\nbuiltins.str = lambda value='': 'passed'",
], ids=["isinstance", "AssertionError", "type", "json", "repr_str"])
def test_overriding_builtins_and_json_scores_zero(rewarder, override):
    _assert_forgery_fails(rewarder, f"import builtins, json\n{WRONG}\n{override}\n")


def test_killing_every_process_it_can_reach_scores_zero(rewarder):
    program = ("import os, signal\ndef f(x):\n    for pid in (os.getppid(), -1, 1):\n        try:\n"
               "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n    return 0\n")
    _assert_forgery_fails(rewarder, program)


def test_an_exception_whose_str_lies_scores_zero(rewarder):
    program = ("class Passed(Exception):\n    def __str__(self):\n        return 'passed'\n    __repr__ = __str__\n"
               "Passed.__name__ = Passed.__qualname__ = 'passed'\n"
               "def f(x):\n    raise Passed()\n")
    info = _assert_forgery_fails(rewarder, program)
    assert all(v["reason"] == "error" for v in info["verdicts"]), info


@pytest.mark.parametrize("body", ["return 'x' * (64 << 20)", "return [[[[x]]]] * (1 << 22)",
                                  "print('y' * (64 << 20))\n    return 0", "return 10 ** 100000"],
                         ids=["huge_string", "huge_list", "huge_print", "huge_int"])
def test_huge_outputs_score_zero(rewarder, body):
    _assert_forgery_fails(rewarder, f"def f(x):\n    {body}\n")


@pytest.mark.parametrize("body", ["while True:\n        pass",
                                  "while True:\n        try:\n            while True:\n                pass\n"
                                  "        except BaseException:\n            pass",
                                  "import time\n    time.sleep(3600)"],
                         ids=["loop", "loop_swallowing_alarms", "sleep"])
def test_a_function_that_never_returns_scores_zero(rewarder, body):
    info = _assert_forgery_fails(rewarder, f"def f(x):\n    {body}\n")
    reasons = [v["reason"] for v in info["verdicts"]]
    # The first call always meets its time limit. Under load, a later test can instead find the program's
    # process already gone (its own limits ended it), which reads as "crashed": seen once in a CI-like run.
    assert reasons[0] == "timeout" and set(reasons) <= {"timeout", "crashed"}, info


def test_writing_verdicts_into_other_processes_through_proc_scores_zero(rewarder):
    # Without namespaces /proc is there; the judge's fds still belong to another uid.
    program = ("import glob, os\ndef f(x):\n    for path in glob.glob('/proc/[0-9]*/fd/*'):\n        try:\n"
               "            fd = os.open(path, os.O_WRONLY)\n"
               "            os.write(fd, b'{\"index\": 0, \"reason\": \"passed\", \"detail\": \"\"}\\n')\n"
               "        except OSError:\n            pass\n    return 0\n")
    _assert_forgery_fails(rewarder, program)
