"""The built-in tools answer everything with an observation: results, errors, timeouts and crashes."""

import pytest

from rlax_core.envs import TOOLS, EnvConfig, PythonToolConfig
from rlax_core.envs.tool_calls import ToolCall
from rlax_core.envs.tools import ToolError, calculate, call_tool
from rlax_core.sandbox.run import SandboxLimits


@pytest.fixture(scope="module")
def tools():
    config = EnvConfig(tools=("python", "calculator"),
                       python=PythonToolConfig(limits=SandboxLimits(cpu_seconds=2, wall_seconds=3.0)))
    return {name: TOOLS[name](config) for name in config.tools}


def _python(code):
    return ToolCall(name="python", arguments={"code": code})


@pytest.mark.parametrize("expression, value", [("2 + 3 * 4", 14), ("(1 + 2) ** 3 / 9", 3.0), ("-7 // 2", -4),
                                               ("10 % 4", 2), ("2 ** -1", 0.5)])
def test_calculator_is_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression, error", [("__import__('os')", "only numbers"), ("9 ** 9 ** 9", "exponent"),
                                               ("1 / 0", "division by zero"), ("1 +", "not an arithmetic"),
                                               ("1" * 300, "characters"), ("(-8) ** 0.5", "not a real number")])
def test_calculator_refuses_with_the_reason(expression, error):
    with pytest.raises(ToolError, match=error):
        calculate(expression)


def test_interpreter_keeps_state_by_replaying_cells_and_hides_their_output(tools):
    state = {}
    assert call_tool(tools, _python("x = 21\nprint('set')"), state)[0] == "set"
    text, info = call_tool(tools, _python("print(x * 2)"), state)
    assert (text, info["ok"]) == ("42", True)  # 'set' is not printed again
    failed, info = call_tool(tools, _python("print(y)"), state)
    assert "NameError" in failed and not info["ok"]
    assert state["python"]["cells"] == ["x = 21\nprint('set')", "print(x * 2)"]  # a failed cell is not replayed


@pytest.mark.parametrize("code, says", [
    ("while True: pass", "TimeoutError: the cell ran past 3 s"),
    ("import os\nos.abort()", "the interpreter died"),
    ("import os\nos._exit(3)", "exit 3"),
    ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    ("raise SystemExit('bye')", "bye"),
])
def test_a_tool_that_times_out_or_crashes_answers_with_an_observation(tools, code, says):
    text, info = call_tool(tools, _python(code), {})
    assert says in text and not info["ok"] and text.startswith("Error:")


def test_malformed_calls_and_unknown_tools_answer_with_errors(tools):
    for call, says in [(ToolCall(error="tool call is not valid JSON"), "not valid JSON"),
                       (ToolCall(name="search", arguments={}), "unknown tool 'search'"),
                       (ToolCall(name="python", arguments={"source": "1"}), 'python needs {"code"'),
                       (ToolCall(name="calculator", arguments={"expression": 3}), "calculator needs")]:
        text, info = call_tool(tools, call, {})
        assert says in text and not info["ok"]


def test_output_is_cut_to_its_limit_keeping_the_end(tools):
    text, _ = call_tool(tools, _python("for i in range(5000): print(i)"), {})
    assert len(text) <= 2000 and text.endswith("4999") and text.startswith("...")
