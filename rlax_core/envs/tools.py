"""The built-in tools: a calculator (a pure function) and a Python interpreter in the code sandbox.

``call_tool`` is the one way a tool runs: whatever the call or the tool does (an unknown name, bad
arguments, an exception, a timeout, a crashed interpreter) it returns the text the policy sees and an
info record; it never raises. So a policy's mistake is an observation, never a lost episode.

The interpreter runs each cell with ``sandbox.run.run_sandboxed``, the sandbox that runs code
under test for the code reward, with its containment unchanged and the limits of
``EnvConfig.python``. State between cells is kept by replay, never by a live process: the episode
remembers the cells that ran without error, and each new cell runs after them in one fresh sandbox
with their output discarded. Nothing survives a cell but its source text, so a cell cannot leave a
process, a file or an open socket behind for the next. The cost is that earlier cells run again
(a cell that reads the clock or randomness may compute other values on replay; ``stateful: false``
makes every cell stand alone), and ``max_cells`` bounds it.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from typing import Any, Mapping

from rlax_core.envs.base import EnvConfig, Tool, register_tool
from rlax_core.envs.tool_calls import ToolCall
from rlax_core.sandbox.run import run_sandboxed


def call_tool(tools: Mapping[str, Tool], call: ToolCall, state: dict) -> tuple[str, dict[str, Any]]:
    """Run ``call`` with the episode's ``state``; (text for the policy, info). Never raises."""
    info = call.as_info()
    if call.error:
        return f"Error: {call.error}", {**info, "ok": False}
    tool = tools.get(call.name)
    if tool is None:
        return f"Error: unknown tool {call.name!r}; available: {', '.join(sorted(tools))}", {**info, "ok": False}
    try:
        output = tool.call(call.arguments, state.setdefault(call.name, {}))
    except ToolError as error:
        return f"Error: {error}", {**info, "ok": False, "output": str(error)}
    except Exception as error:  # noqa: BLE001 - a tool's own failure is the policy's observation
        message = f"{call.name} failed: {type(error).__name__}: {error}"[:500]
        return f"Error: {message}", {**info, "ok": False, "output": message}
    return output, {**info, "ok": True, "output": output}


class ToolError(Exception):
    """A tool's answer that is an error (bad arguments, a failed cell): its message goes to the policy."""


# ---------------------------------------------------------------------------------------------- calculator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 256
MAX_MAGNITUDE = 1e100


def calculate(expression: str) -> int | float:
    """Arithmetic on numbers: + - * / // % ** and parentheses. Bounded: the expression's length, the
    exponents and every intermediate magnitude are capped, so no input runs long or grows huge."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression of {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError(f"not an arithmetic expression: {expression[:80]!r}") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_evaluate(node.operand))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or (abs(left) > 1 and abs(right) * math.log10(abs(left)) > 100)):
            raise ToolError("exponent too large")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        if isinstance(value, complex):
            raise ToolError("the result is not a real number")
    else:
        raise ToolError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")
    if abs(value) > MAX_MAGNITUDE:
        raise ToolError(f"a value exceeds {MAX_MAGNITUDE:g}")
    return value


@register_tool("calculator")
class Calculator(Tool):
    description = "Evaluate an arithmetic expression with + - * / // % ** and parentheses."
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}

    def call(self, arguments, state):
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolError('calculator needs {"expression": "<arithmetic>"}')
        value = calculate(expression)
        return repr(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else repr(value)


# ---------------------------------------------------------------------------------------------- interpreter

# Runs inside the sandbox (python -I -S): earlier cells with their output discarded, then the new one.
_RUNNER = r'''
import contextlib, io, json, sys, traceback
cells = json.load(open("cells.json"))
scope = {"__name__": "__main__"}
for index, cell in enumerate(cells):
    last = index == len(cells) - 1
    sink = contextlib.nullcontext() if last else contextlib.redirect_stdout(io.StringIO())
    try:
        with sink:
            exec(compile(cell, f"<cell {index + 1}>", "exec"), scope)
    except BaseException as error:
        lines = traceback.format_exception_only(type(error), error)
        sys.stderr.write(("" if last else f"(replaying cell {index + 1}) ") + lines[-1].strip() + "\n")
        sys.stdout.flush()
        sys.exit(1)
'''


@register_tool("python")
class PythonInterpreter(Tool):
    description = "Run Python code and return what it prints (state is kept across calls in one episode)."
    parameters = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}

    def __init__(self, config: EnvConfig):
        super().__init__(config)
        self.settings = config.python

    def call(self, arguments, state):
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError('python needs {"code": "<python source>"}')
        earlier = state.setdefault("cells", []) if self.settings.stateful else []
        if len(earlier) >= self.settings.max_cells:
            raise ToolError(f"the interpreter holds at most {self.settings.max_cells} cells per episode")
        limits = self.settings.limits
        report = run_sandboxed({"cells.json": json.dumps([*earlier, code]), "runner.py": _RUNNER}, ["runner.py"], limits)
        out = report.stdout
        if report.timed_out:
            raise ToolError(_cut(out, f"TimeoutError: the cell ran past {limits.wall_seconds:g} s", self.settings))
        if report.signal is not None or report.exit_code not in (0, 1):
            raise ToolError(_cut(out, f"the interpreter died (signal {report.signal}, exit {report.exit_code}); "
                                      "it may have run out of memory or CPU time", self.settings))
        if report.exit_code == 1:
            raise ToolError(_cut(out, report.stderr.strip().splitlines()[-1] if report.stderr.strip() else "error",
                                 self.settings))
        if self.settings.stateful:
            earlier.append(code)
        return _cut(out, "", self.settings) or "(no output)"


def _cut(stdout: str, error: str, settings) -> str:
    """stdout then the error line, within ``max_output_chars`` (the end of stdout kept: it has the answer)."""
    limit = settings.max_output_chars - len(error)
    if len(stdout) > limit:
        stdout = "..." + stdout[-(limit - 3):]
    return (stdout + error).strip("\n") if error else stdout.rstrip("\n")
