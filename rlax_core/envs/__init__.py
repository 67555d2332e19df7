"""Multi-turn episodes: environments, tools, tool-call parsing and the episode runner (no Beam).

    from rlax_core.envs import EnvConfig, EpisodeStart, run_episodes
    episodes = run_episodes(engine, tokenizer, EnvConfig(name="tool_use", tools=("python",)), starts, sampling)

``base``: the Environment and Tool interfaces, ``EnvConfig`` and the registries
(``register_environment``, ``register_tool``); ``tool_calls``: the Hermes / Qwen2.5 and fenced-Python
call formats; ``tools``: the calculator and the sandboxed interpreter; ``tool_use``: a task answered
with tools; ``word_chain``: the CPU demonstration's task; ``runner``: episodes on the engine.
docs/multi_turn.md explains the episode format, the masks and the staleness rule.
"""

from rlax_core.envs.base import (ENVIRONMENTS, TOOLS, Environment, EnvConfig, PythonToolConfig, Tool, TurnResult,
                                 import_env_modules, make_environment, register_environment, register_tool)
from rlax_core.envs.runner import Episode, EpisodeStart, RecordedEnvironment, run_episodes
from rlax_core.envs.tool_calls import FORMATS, ToolCall, parse_tool_calls

__all__ = ["ENVIRONMENTS", "FORMATS", "TOOLS", "EnvConfig", "Environment", "Episode", "EpisodeStart",
           "PythonToolConfig", "RecordedEnvironment", "Tool", "ToolCall", "TurnResult", "import_env_modules",
           "make_environment", "parse_tool_calls", "register_environment", "register_tool", "run_episodes"]
