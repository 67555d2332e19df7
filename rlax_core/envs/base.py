"""Environments and tools by name: what an episode sees, what it returns, and the registries that find them.

An environment runs one episode. It is built from a dataset row (an Example), gives the first prompt,
then takes the policy's text each turn and answers with the next observation, a reward and whether
the episode is over::

    @register_environment("echo_twice")
    class EchoTwice(Environment):
        def reset(self):
            return self.row["prompt"]
        def step(self, text):
            self.turn += 1
            done = self.turn == 2
            return TurnResult(observation="" if done else "\\nSay it again:", reward=float("cat" in text), done=done)

A tool is a function the policy calls from its text (``tool_calls``); an environment owns the tools
its config names. Users register both as they register reward terms: a module named in the config's
``env.modules`` is imported on every worker before the environment is built (``import_env_modules``).

Budgets (``EnvConfig``): ``max_turns`` policy turns, ``max_turn_tokens`` per turn and ``max_tokens``
for the whole transcript (prompt, turns and observations). The episode runner enforces them, not the
environment: a turn is cut to what the budget has left, an observation that no longer fits ends
the episode with finish reason "length", and the episode ends after ``max_turns`` turns whatever the
environment answered (so an environment reports its verdict, ``info["pass"]``, on every turn).
``step_timeout_s`` bounds the wait for an environment's answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, TypeVar

from rlax_core.config import ConfigError, require
from rlax_core.sandbox.run import SandboxLimits
from rlax_core.utils.registry import Registry
from rlax_core.utils.user_modules import UserModuleError, import_user_module

# Packages of this repository whose import registers environments and tools.
BUILTIN_MODULES = ("rlax_core.envs.tools", "rlax_core.envs.tool_use", "rlax_core.envs.word_chain",
                   "rlax_core.envs.sql_env")


@dataclasses.dataclass(frozen=True)
class TurnResult:
    """What the environment answers to one policy turn.

    ``observation`` is appended to the transcript as it is (the environment formats it: chat
    markers, ``<tool_response>``...); ``info`` is JSON-friendly and stored with the rollout (tool
    calls and their outputs: what replaying the episode needs).
    """

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PythonToolConfig:
    """The sandboxed interpreter (``tools.PythonInterpreter``): the code reward's sandbox, its limits."""

    limits: SandboxLimits = dataclasses.field(default_factory=lambda: SandboxLimits(cpu_seconds=5, wall_seconds=10.0))
    max_output_chars: int = 2000  # of stdout + the error line shown to the policy
    stateful: bool = True  # replay the episode's earlier successful cells before each new one
    max_cells: int = 16  # cells one episode may replay; beyond, the interpreter answers with an error

    def __post_init__(self):
        require(self.max_output_chars >= 64, "max_output_chars", "must be >= 64")
        require(self.max_cells >= 1, "max_cells", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The ``env:`` section: which environment, its budgets, tools and options.

    name: a registered environment. modules: a user's modules or .py files that register
    environments or tools (imported first, on every worker). tool_format: which tool-call syntax
    the policy's text is parsed for (``tool_calls.FORMATS``). options: the environment's own
    settings, passed to it as they are.
    """

    name: str = "tool_use"
    modules: tuple[str, ...] = ()
    max_turns: int = 4
    max_turn_tokens: int = 256
    max_tokens: int = 1024
    tools: tuple[str, ...] = ("python",)
    tool_format: str = "hermes"
    max_calls_per_turn: int = 4
    tool_workers: int = 4  # environment steps (tool calls) running at once per engine replica
    # How long the episode runner waits for an environment's answer to a turn (its tool calls
    # included) before it fails loudly: a step that hangs must not hang the rollout worker.
    step_timeout_s: float = 60.0
    # In the loop: add the run's reward terms (loop.rewards), scored on the policy's text of the whole
    # episode, to the environment's turn rewards (tool_use: the verifier judges the answer). False:
    # the turn rewards are the whole reward (word_chain).
    judge_answer: bool = True
    python: PythonToolConfig = dataclasses.field(default_factory=PythonToolConfig)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        from rlax_core.envs.tool_calls import FORMATS

        try:
            import_env_modules(self.modules)
        except UserModuleError as error:
            raise ConfigError("modules", str(error)) from None
        require(self.name in ENVIRONMENTS, "name", f"unknown environment; known: {', '.join(sorted(ENVIRONMENTS))}")
        for tool in self.tools:
            require(tool in TOOLS, "tools", f"unknown tool {tool!r}; known: {', '.join(sorted(TOOLS))}")
        require(self.tool_format in FORMATS, "tool_format", f"one of {', '.join(FORMATS)}")
        require(self.max_turns >= 1, "max_turns", "must be >= 1")
        require(self.max_turn_tokens >= 1, "max_turn_tokens", "must be >= 1")
        require(self.max_tokens > self.max_turn_tokens, "max_tokens", "must exceed max_turn_tokens (it holds the prompt too)")
        require(self.max_calls_per_turn >= 1, "max_calls_per_turn", "must be >= 1")
        require(self.tool_workers >= 1, "tool_workers", "must be >= 1")
        require(self.step_timeout_s > 0, "step_timeout_s", "must be > 0")
        calls_s = self.python.limits.wall_seconds * self.max_calls_per_turn
        require("python" not in self.tools or self.step_timeout_s > calls_s, "step_timeout_s",
                f"must exceed what a turn's python calls may take: max_calls_per_turn x python.limits.wall_seconds "
                f"= {calls_s:g} s")


class Environment:
    """One episode. Built per episode from its row; ``reset`` once, then ``step`` once per policy turn.

    ``step`` must not raise for anything the policy wrote: a bad tool call is an observation saying
    so (``tools.call_tool`` answers every failure with one). What it raises ends the episode, with
    the error recorded (``runner``): nothing is lost, but the episode earns nothing more.
    """

    add_bos = True  # whether BOS precedes the prompt text (a chat template writes its own)
    stop_strings: tuple[str, ...] = ()  # where a turn ends besides EOS (e.g. after a tool call)

    def __init__(self, config: EnvConfig, row: Mapping[str, Any], tokenizer=None):
        self.config = config
        self.row = row
        self.tokenizer = tokenizer  # for chat templates; None for plain-text environments
        self.turn = 0

    def reset(self) -> str:
        """The first prompt's text."""
        raise NotImplementedError

    def step(self, text: str, finish_reason: str = "stop") -> TurnResult:
        """Answer the policy's ``text`` of this turn (``finish_reason``: the engine's, "stop" or "length")."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the episode holds (e.g. a tool's state)."""


class Tool:
    """A named function the policy calls: ``call(arguments, state)`` returns the text the policy sees.

    ``parameters`` is its JSON schema, shown to the policy in the system prompt (Hermes / Qwen2.5
    tool use). ``state`` is a dict private to the episode (the interpreter keeps its cells there).
    """

    name = ""
    description = ""
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, config: EnvConfig):
        self.config = config

    def call(self, arguments: Mapping[str, Any], state: dict) -> str:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


E = TypeVar("E", bound=type[Environment])
T = TypeVar("T", bound=type[Tool])
ENVIRONMENTS: Registry = Registry("environment")
TOOLS: Registry = Registry("tool")


def register_environment(name: str) -> Callable[[E], E]:
    """Class decorator: make an :class:`Environment` selectable as ``env.name``."""
    return ENVIRONMENTS.register(name)


def register_tool(name: str) -> Callable[[T], T]:
    """Class decorator: make a :class:`Tool` selectable in ``env.tools``; the tool takes the name."""

    def decorate(cls: T) -> T:
        TOOLS.add(name, cls)
        cls.name = name
        return cls

    return decorate


def import_env_modules(modules: tuple[str, ...] = ()) -> None:
    """The built-in environments and tools, then a user's ``modules`` (names or .py files, once per process)."""
    for spec in (*BUILTIN_MODULES, *modules):
        import_user_module(spec, "environment")


def make_environment(config: EnvConfig, row: Mapping[str, Any], tokenizer=None) -> Environment:
    import_env_modules(config.modules)
    return ENVIRONMENTS[config.name](config, row, tokenizer)
