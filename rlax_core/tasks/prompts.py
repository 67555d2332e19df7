"""Each task's prompt format: the one place that turns an Example into the model's input.

Difficulty filtering, rollouts and evaluation all call :func:`prompt_ids`, so a policy is trained on
the same text it is judged on:

* ``math``: the problem, then "reason step by step, and put your final answer within \\boxed{}"
  (the math reward reads the last ``\\boxed{}``);
* ``code``: the problem, the first of its tests when it has a list of them (MBPP names the function
  only there), then "write the program in one fenced Python block" (the code reward runs the last
  fenced block);
* ``sql``: the database's schema (``tasks.sql``), the question, then "write one SQLite query in a
  ```sql block" (the sql reward runs the last one);
* ``story``: the prompt as it is (stories260K continues text; it cannot follow instructions).

A format with ``chat`` sends that text as one user turn through the tokenizer's chat template when the
tokenizer has one (instruction-tuned checkpoints); otherwise the text follows the BOS token as is.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping

from rlax_core.tasks.sql import SQL_INSTRUCTION, sql_prompt_body

BOXED_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = "\nWrite the complete solution as one Python program in a single ```python code block."


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How one task's examples become text: the body, the instruction after it, and the chat turn."""

    instruction: str = ""
    chat: bool = True  # one user turn in the tokenizer's chat template, when it has one
    body: Callable[[Mapping[str, Any]], str] = lambda example: example["prompt"]

    def text(self, example: Mapping[str, Any]) -> str:
        return self.body(example) + self.instruction


def _code_body(example: Mapping[str, Any]) -> str:
    tests = example.get("tests")
    tests = json.loads(tests) if isinstance(tests, str) else tests
    cases = tests.get("test_list") if isinstance(tests, dict) else None
    if cases:
        return f"{example['prompt']}\nYour code should pass this test:\n{cases[0]}"
    return example["prompt"]


TASK_PROMPTS: dict[str, PromptFormat] = {
    "math": PromptFormat(instruction=BOXED_INSTRUCTION),
    "code": PromptFormat(instruction=CODE_INSTRUCTION, body=_code_body),
    "sql": PromptFormat(instruction=SQL_INSTRUCTION, body=sql_prompt_body),
    "story": PromptFormat(chat=False),
}


def prompt_format(task: str) -> PromptFormat:
    if task not in TASK_PROMPTS:
        raise ValueError(f"no prompt format for task {task!r}; known tasks: {', '.join(sorted(TASK_PROMPTS))}")
    return TASK_PROMPTS[task]


def render_prompt(example: Mapping[str, Any], tokenizer) -> tuple[str, bool]:
    """``(text, add_bos)``: the exact text the model reads for ``example``, and whether BOS goes before it."""
    fmt = prompt_format(example["task"])
    text = fmt.text(example)
    if fmt.chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True), False
    return text, True


def prompt_ids(example: Mapping[str, Any], tokenizer) -> list[int]:
    """The token ids of :func:`render_prompt`."""
    text, add_bos = render_prompt(example, tokenizer)
    return list(tokenizer.encode(text, add_bos=add_bos))
