"""``tool_use``: a task prompt, then turns in which the policy may call tools until it answers.

A turn with tool calls is answered with their outputs; a turn without one is the answer and ends the
episode (the runner ends it after ``max_turns`` turns too). The answer is judged by the run's reward terms on the policy's text
of all turns (the math verifier reads the last ``\\boxed{}``), so the environment's own turn rewards
are 0 unless ``options.call_penalty`` charges for each failed call.

Formats (``EnvConfig.tool_format``, see ``tool_calls``):

* ``hermes``: the prompt is the task's chat turn rendered with the tools' JSON schemas (the chat
  template's ``tools`` variable, as Qwen2.5-Instruct's template expects), and each tool output comes
  back as a user turn ``<tool_response>...</tool_response>``, the template's own shape;
* ``python_block``: the output follows the code as ```` ```output ... ``` ```` and the policy goes on.
"""

from __future__ import annotations

from typing import Any, Mapping

from rlax_core.envs.base import TOOLS, Environment, EnvConfig, TurnResult, register_environment
from rlax_core.envs.tool_calls import HERMES_CLOSE, parse_tool_calls
from rlax_core.envs.tools import call_tool
from rlax_core.tasks.prompts import prompt_format

TOOL_INSTRUCTION = ("\nYou may run Python to compute: write a ```python code block and its printed output will "
                    "follow.")


@register_environment("tool_use")
class ToolUseEnvironment(Environment):
    def __init__(self, config: EnvConfig, row: Mapping[str, Any], tokenizer=None):
        super().__init__(config, row, tokenizer)
        self.tools = {name: TOOLS[name](config) for name in config.tools}
        self.tool_state: dict = {}
        self.add_bos = True
        hermes = config.tool_format == "hermes"
        # A turn that calls a tool ends where its call does: the runner stops sampling there.
        self.stop_strings = (HERMES_CLOSE,) if hermes else ("```\n",)

    def _chat(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def reset(self) -> str:
        fmt = prompt_format(self.row.get("task", "math"))
        text = fmt.text(self.row)
        if self.config.tool_format == "python_block":
            text += TOOL_INSTRUCTION
        if self._chat():
            self.add_bos = False
            tools = [tool.schema() for tool in self.tools.values()] if self.config.tool_format == "hermes" else None
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                      tools=tools)
        return text + "\n"

    def step(self, text: str, finish_reason: str = "stop") -> TurnResult:
        self.turn += 1
        calls = parse_tool_calls(text, self.config.tool_format, self.config.max_calls_per_turn)
        if not calls:
            return TurnResult(done=True, info={"answered": True})
        outputs, infos = [], []
        for call in calls:
            output, info = call_tool(self.tools, call, self.tool_state)
            outputs.append(output)
            infos.append(info)
        penalty = float(self.config.options.get("call_penalty", 0.0)) * sum(not info["ok"] for info in infos)
        return TurnResult(observation=self._observation(outputs), reward=-penalty, info={"calls": infos})

    def _observation(self, outputs: list[str]) -> str:
        if self.config.tool_format == "python_block":
            return "".join(f"```output\n{output}\n```\n" for output in outputs)
        if self._chat():
            responses = "\n".join(f"<tool_response>\n{output}\n</tool_response>" for output in outputs)
            # ChatML, as Qwen2.5's template renders tool results. The policy's turn stopped at
            # </tool_call>, before its end-of-turn marker: the observation closes the turn.
            return f"<|im_end|>\n<|im_start|>user\n{responses}<|im_end|>\n<|im_start|>assistant\n"
        return "".join(f"\n<tool_response>\n{output}\n</tool_response>\n" for output in outputs)
