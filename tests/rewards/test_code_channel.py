"""The plain-data channel between the program's sandbox and the judge's, and how the judge uses it."""

import json
import math
import random

import pytest

from rlax_core.rewards import plain_data
from rlax_core.rewards.code_verifier import CodeTests, run_tests
from rlax_core.sandbox.run import SandboxLimits

LIMITS = SandboxLimits(cpu_seconds=3, wall_seconds=10.0, memory_bytes=256 << 20, file_bytes=4 << 20,
                       workdir_bytes=8 << 20)
BUILTIN_TYPES = {type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
                 range, type(iter([]))}


def _check(program: str, *cases: str, **fields) -> list:
    result = run_tests(program, CodeTests(cases=cases, **fields), LIMITS, per_test_seconds=2.0)
    return [(v.reason, v.detail) for v in result.verdicts]


# ----------------------------------------------------------------------------- plain_data, in this process


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2 ** 5000, -(3 ** 4000), 1.5, -0.0, float("inf"), float("-inf"), 1e308, 2.5 - 1j,
    "", "héllo\n\x00", b"\x00\xff", bytearray(b"ab"), [1, [2, [3]]], (1, (2,)), (), {"a": 1, (1, 2): [3], None: {}},
    {1, 2, 3}, frozenset({"x", (1, 2)}), range(1, 10, 3), [{"k": (1.0, frozenset())}],
])
def test_plain_values_round_trip_with_their_types(value):
    back = plain_data.decode(plain_data.encode(value))
    assert type(back) is type(value) and back == value
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_and_iterators_cross_as_themselves():
    assert math.isnan(plain_data.decode(plain_data.encode(float("nan"))))
    back = plain_data.decode(plain_data.encode(x * x for x in range(4)))
    assert type(back) is type(iter([])) and list(back) == [0, 1, 4, 9]
    assert list(plain_data.decode(plain_data.encode(map(str, [1, 2])))) == ["1", "2"]


@pytest.mark.parametrize("value", [object(), print, lambda: 1, type("Mine", (), {})(), [1, object()],
                                   type("Sub", (int,), {})(3), type("Sub", (list,), {})()])
def test_other_objects_are_not_plain_data(value):
    with pytest.raises(plain_data.NotPlainData):
        plain_data.encode(value)
    numbered = []
    wire = plain_data.to_wire(value, lambda obj: (numbered.append(obj) or len(numbered) - 1, type(obj).__name__))
    assert numbered and numbered[0] is (value[1] if type(value) is list else value)
    assert "object" in json.dumps(wire)


@pytest.mark.parametrize("text", [
    "{}", '{"$": "Anything"}', '{"$": "object", "handle": 0}', '{"$": "dict", "v": [[[1], 2]]}',
    '{"$": "set", "v": [[1]]}', '{"$": "int", "v": "zz"}', '{"$": "float", "v": "1.5"}', '{"$": "tuple", "v": 3}',
    '{"$": "dict", "v": [[1, 2, 3]]}', "[" * 5000 + "]" * 5000, "1" * 5000, "NaN", "not json", '{"$": "range", "v": [1]}',
])
def test_decode_refuses_what_is_not_plain_data(text):
    with pytest.raises(plain_data.BadWireData):
        plain_data.decode(text)


def test_decode_builds_only_builtin_types_from_any_json():
    rng = random.Random(18)
    tags = ["tuple", "set", "frozenset", "dict", "iter", "int", "float", "complex", "bytes", "range", "object", "x"]

    def wire(depth):
        choice = rng.randrange(8 if depth < 4 else 4)
        if choice == 0:
            return rng.choice([None, True, 1, -2.5, "s", 10 ** 30])
        if choice in (1, 2, 3):
            return rng.choice(["ff", "nan", [1.0, 2.0], [0, 5, 1], 7, [], [[1, 2]]])
        if choice == 4:
            return [wire(depth + 1) for _ in range(rng.randrange(3))]
        return {"$": rng.choice(tags), "v": wire(depth + 1), "handle": rng.choice([0, "0"])}

    def types_in(value):
        yield type(value)
        if isinstance(value, dict):
            for key, item in value.items():
                yield from types_in(key)
                yield from types_in(item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                yield from types_in(item)

    decoded = 0
    for _ in range(3000):
        try:
            value = plain_data.decode(json.dumps(wire(0)))
        except plain_data.BadWireData:
            continue
        decoded += 1
        assert set(types_in(value)) <= BUILTIN_TYPES
    assert decoded > 500


def test_decode_refuses_more_than_its_byte_budget():
    with pytest.raises(plain_data.BadWireData, match="more than 10 bytes"):
        plain_data.decode(json.dumps("x" * 20), max_bytes=10)


# ----------------------------------------------------------------------------- the judge, through run_tests


def test_the_programs_own_objects_are_opaque_handles():
    program = ("class Box:\n    def __init__(self, v):\n        self.v = v\n    def __eq__(self, other):\n"
               "        return True\n    def __bool__(self):\n        return True\n"
               "def make(v):\n    return Box(v)\ndef unbox(box):\n    return box.v\n")
    verdicts = _check(program, "assert make(1) == 1", "assert make(1)", "assert make(1).v == 1",
                      "b = make(5)\nassert unbox(b) == 5 and b == b and b != make(5)", "assert make(2) is not None")
    assert [reason for reason, _ in verdicts] == ["failed", "error", "error", "passed", "passed"], verdicts
    assert "no truth value" in verdicts[1][1] and "not plain data" in verdicts[2][1]


def test_helpers_from_the_prompt_are_the_trusted_ones():
    # HumanEval/32's shape: the test checks the answer with the prompt's own helper.
    prompt = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\ndef find_zero(xs):\n"
    test = "def check(candidate):\n    assert abs(poly([-2, 1], candidate([-2, 1]))) < 1e-6\n\ncheck(find_zero)\n"
    tests = dict(prompt=prompt, entry_point="find_zero")
    assert _check(prompt + "    return -xs[0] / xs[1]\n", test, **tests)[0][0] == "passed"
    cheat = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 12345.0\n"
    assert _check(cheat, test, **tests)[0][0] == "failed"


def test_a_standard_module_a_test_names_is_the_real_one():
    cheat = ("import types\nsys = types.SimpleNamespace(getsizeof=lambda value: -1)\n"
             "def tuple_size(value):\n    return -1\n")
    verdicts = _check(cheat, "assert tuple_size((1, 2)) == sys.getsizeof((1, 2))")
    assert verdicts[0][0] == "failed"
    honest = "import sys\ndef tuple_size(value):\n    return sys.getsizeof(value)\n"
    assert _check(honest, "assert tuple_size((1, 2)) == sys.getsizeof((1, 2))")[0][0] == "passed"


def test_a_builtin_name_is_never_the_programs():
    cheat = "def sorted(value):\n    return [1, 2, 3]\ndef f(x):\n    return [3, 1]\n"
    verdicts = _check(cheat, "assert sorted(f(0)) == [1, 2, 3]", "assert sum(1, 2) == 3")
    assert [reason for reason, _ in verdicts] == ["failed", "error"]
    assert "the program defines sorted, but sorted here is the builtin" in verdicts[0][1]


def test_an_argument_that_is_not_plain_data_fails_closed_with_its_reason():
    verdicts = _check("def apply(fn, x):\n    return fn(x)\n", "assert apply(lambda v: v + 1, 1) == 2")
    assert verdicts[0][0] == "error" and "cannot be sent to the program" in verdicts[0][1], verdicts


def test_exceptions_cross_as_their_nearest_builtin():
    program = ("class Oops(ValueError):\n    pass\nclass Mine(Exception):\n    pass\n"
               "def strict(x):\n    raise Oops('negative')\ndef other(x):\n    raise Mine('negative')\n")
    expect_raise = "try:\n    {call}\nexcept ValueError as error:\n    assert 'negative' in str(error)\nelse:\n    assert False"
    verdicts = _check(program, expect_raise.format(call="strict(-1)"), expect_raise.format(call="other(-1)"))
    assert verdicts[0][0] == "passed" and verdicts[1] == ("error", "ProgramError: Mine: negative"), verdicts


def test_a_program_that_stops_answering_times_out_every_later_call():
    program = ("import time\ndef hang(x):\n    while True:\n        try:\n            time.sleep(100)\n"
               "        except BaseException:\n            pass\ndef ok(x):\n    return x\n")
    verdicts = _check(program, "assert hang(1) == 1", "assert ok(2) == 2", "assert True")
    assert [reason for reason, _ in verdicts] == ["timeout", "timeout", "passed"], verdicts
    assert "stopped answering" in verdicts[1][1]


def test_the_program_never_sees_the_tests():
    program = ("import gc, os\ndef leak():\n    needle, found = '-'.join(['SECRET', 'EXPECTED']), []\n"
               "    for o in gc.get_objects():\n"
               "        items = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()\n"
               "        found += [x[:40] for x in items if isinstance(x, str) and needle in x]\n"
               "    return found + [name for name in os.listdir('.') if 'job' in name]\n")
    assert _check(program, "assert leak() == [], 'SECRET-EXPECTED-VALUE'") == [("passed", "")]


def test_standard_dicts_and_builtin_types_cross_as_themselves():
    import collections

    for value in (collections.Counter("abca"), collections.OrderedDict([(2, 1), (1, 2)]),
                  collections.defaultdict(list, {"k": [1]})):
        back = plain_data.decode(plain_data.encode(value))
        assert type(back) is type(value) and back == value
    assert plain_data.decode(plain_data.encode([int, str, ValueError])) == [int, str, ValueError]
    for function in (eval, getattr, open, type):
        with pytest.raises(plain_data.NotPlainData):
            plain_data.encode(function)
        with pytest.raises(plain_data.BadWireData):
            plain_data.decode(json.dumps({"$": "builtin", "v": function.__name__}))


def test_an_answer_over_the_size_cap_is_an_error_and_the_channel_recovers():
    program = ("import os\ndef flood(x):\n    junk = b'[' + b'1,' * (1 << 20) + b'1]\\n'\n    while junk:\n"
               "        junk = junk[os.write(5, junk):]\n    return x * x\n"
               "def big(x):\n    return 'x' * (2 << 20)\ndef square(x):\n    return x * x\n")
    verdicts = _check(program, "assert flood(2) == 4", "assert big(1)", "assert square(3) == 9")
    assert [reason for reason, _ in verdicts] == ["error", "error", "passed"], verdicts
    assert "over 1048576 bytes" in verdicts[0][1] and "ResultTooLarge" in verdicts[1][1]
