"""Tool calls read from the policy's text, in two documented formats.

``hermes`` (Hermes 2 Pro, Qwen2.5-Instruct and Qwen3 chat templates)::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(2 ** 10)"}}
    </tool_call>

``arguments`` may also be a JSON-encoded string of the object (some checkpoints write that).

``python_block`` (ToRL / SimpleTIR style: the model writes code, the interpreter's output follows)::

    ```python
    print(2 ** 10)
    ```

is a call of the ``python`` tool with ``{"code": ...}``; ```` ```py ```` opens one too.

Every call found in a turn, in order, up to ``max_calls``. Something that starts a call but does not
form one (an unclosed tag or fence, JSON that does not parse, no ``name``, arguments that are not an
object, a payload over ``MAX_CALL_CHARS``) is a call with an ``error``: the policy is answered with
that error, and nothing raises. Parsing is linear in the text: each search starts where the last one
ended, and at most ``MAX_TEXT_CHARS`` of a turn are read.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

FORMATS = ("hermes", "python_block")
MAX_TEXT_CHARS = 65536
MAX_CALL_CHARS = 16384

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
FENCE_OPENS, FENCE_CLOSE = ("```python\n", "```py\n"), "```"


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call: a tool's name and arguments, or the reason it could not be read."""

    name: str = ""
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""

    def as_info(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments), **({"error": self.error} if self.error else {})}


def parse_tool_calls(text: str, tool_format: str, max_calls: int = 4) -> list[ToolCall]:
    """The calls in ``text`` (``[]`` when it has none: the policy answered)."""
    if tool_format not in FORMATS:
        raise ValueError(f"tool_format {tool_format!r}: one of {', '.join(FORMATS)}")
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS]
    calls = _hermes(text, max_calls) if tool_format == "hermes" else _python_blocks(text, max_calls)
    return calls[:max_calls]


def _hermes(text: str, max_calls: int) -> list[ToolCall]:
    calls, at = [], 0
    while len(calls) < max_calls:
        start = text.find(HERMES_OPEN, at)
        if start < 0:
            break
        end = text.find(HERMES_CLOSE, start + len(HERMES_OPEN))
        if end < 0:
            calls.append(ToolCall(error=f"unclosed {HERMES_OPEN}: write {HERMES_OPEN}{{json}}{HERMES_CLOSE}"))
            break
        calls.append(_hermes_payload(text[start + len(HERMES_OPEN):end].strip()))
        at = end + len(HERMES_CLOSE)
    return calls


def _hermes_payload(payload: str) -> ToolCall:
    if len(payload) > MAX_CALL_CHARS:
        return ToolCall(error=f"tool call of {len(payload)} characters; at most {MAX_CALL_CHARS}")
    try:
        call = json.loads(payload)
    except (ValueError, RecursionError) as error:
        return ToolCall(error=f"tool call is not valid JSON: {str(error)[:200]}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return ToolCall(error='tool call must be a JSON object with a "name" string and "arguments"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return ToolCall(name=call["name"], error='"arguments" is a string that is not a JSON object')
    if not isinstance(arguments, dict):
        return ToolCall(name=call["name"], error='"arguments" must be a JSON object')
    return ToolCall(name=call["name"], arguments=arguments)


def _python_blocks(text: str, max_calls: int) -> list[ToolCall]:
    calls, at = [], 0
    while len(calls) < max_calls:
        found = [(text.find(fence, at), fence) for fence in FENCE_OPENS]
        found = [(start, fence) for start, fence in found if start >= 0]
        if not found:
            break
        start, fence = min(found)
        body = start + len(fence)
        end = text.find(FENCE_CLOSE, body)
        if end < 0:
            calls.append(ToolCall(name="python", error="unclosed ```python block: end the code with ```"))
            break
        code = text[body:end]
        if len(code) > MAX_CALL_CHARS:
            calls.append(ToolCall(name="python", error=f"code of {len(code)} characters; at most {MAX_CALL_CHARS}"))
        else:
            calls.append(ToolCall(name="python", arguments={"code": code}))
        at = end + len(FENCE_CLOSE)
    return calls
