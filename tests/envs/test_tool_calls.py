"""Tool calls read from text: both documented formats, malformed calls as errors, bounded parsing."""

import json
import time

import pytest

from rlax_core.envs.tool_calls import MAX_CALL_CHARS, MAX_TEXT_CHARS, parse_tool_calls


def _hermes(payload: str) -> str:
    return f"Let me compute.\n<tool_call>\n{payload}\n</tool_call>"


def test_hermes_calls_with_object_or_string_arguments():
    text = (_hermes(json.dumps({"name": "python", "arguments": {"code": "print(1)"}}))
            + _hermes(json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "2+2"})})))
    calls = parse_tool_calls(text, "hermes")
    assert [(c.name, dict(c.arguments), c.error) for c in calls] == [
        ("python", {"code": "print(1)"}, ""), ("calculator", {"expression": "2+2"}, "")]
    assert parse_tool_calls("The answer is \\boxed{4}.", "hermes") == []


@pytest.mark.parametrize("text, error", [
    (_hermes("{name: python}"), "not valid JSON"),
    (_hermes('["python"]'), 'a "name" string'),
    (_hermes('{"name": "python", "arguments": [1]}'), '"arguments" must be a JSON object'),
    (_hermes('{"name": "python", "arguments": "not json"}'), "not a JSON object"),
    ("<tool_call>{\"name\": \"python\"", "unclosed <tool_call>"),
    (_hermes('{"name": "python", "arguments": {"code": "' + "x" * MAX_CALL_CHARS + '"}}'), "at most"),
    (_hermes("[" * 5000 + "]" * 5000), "not valid JSON"),  # nesting past the recursion limit
])
def test_malformed_hermes_calls_are_errors_not_exceptions(text, error):
    [call] = parse_tool_calls(text, "hermes")
    assert error in call.error


def test_python_blocks_and_an_unclosed_fence():
    text = "First:\n```python\nx = 2\nprint(x)\n```\nthen\n```py\nprint(3)\n```\nand\n```python\nprint("
    calls = parse_tool_calls(text, "python_block")
    assert [c.arguments.get("code") for c in calls] == ["x = 2\nprint(x)\n", "print(3)\n", None]
    assert "unclosed" in calls[-1].error
    assert parse_tool_calls("plain ```text``` only", "python_block") == []


def test_calls_per_turn_and_text_read_are_bounded():
    many = _hermes('{"name": "python", "arguments": {"code": "1"}}') * 50
    assert len(parse_tool_calls(many, "hermes", max_calls=4)) == 4
    # A huge turn reads only its first MAX_TEXT_CHARS: a call past them is not seen.
    late = "a" * MAX_TEXT_CHARS + _hermes('{"name": "python", "arguments": {}}')
    assert parse_tool_calls(late, "hermes") == []


def test_adversarial_text_is_read_once_from_left_to_right():
    # Many openings and no closings: every search starts where the previous one ended, so this reads
    # the text once (a parser that rescanned from each opening would take 6000 passes).
    [call] = parse_tool_calls("<tool_call>" * 6000, "hermes", max_calls=4)
    assert "unclosed" in call.error
    # Each fence's opening closes the one before it: empty cells, at most max_calls of them.
    calls = parse_tool_calls("```python\n" * 6000, "python_block", max_calls=4)
    assert [dict(c.arguments) for c in calls] == [{"code": ""}] * 4
