"""Environments and tools by name: registration, refusal of taken names, user modules, the docs' config."""

import re
from pathlib import Path

import pytest
import yaml

from rlax_core.config import ConfigError, from_dict
from rlax_core.envs import ENVIRONMENTS, EnvConfig, Environment, TurnResult, import_env_modules, make_environment, register_environment

DOCS = Path(__file__).resolve().parents[2] / "docs" / "multi_turn.md"


def test_a_taken_name_is_refused():
    import_env_modules()  # the built-in environments
    with pytest.raises(ValueError, match="'word_chain' is already registered"):
        @register_environment("word_chain")
        class Other(Environment):
            pass


def test_a_user_module_registers_an_environment_on_import(tmp_path):
    module = tmp_path / "my_envs.py"
    module.write_text(
        "from rlax_core.envs import Environment, TurnResult, register_environment\n"
        "@register_environment('echo_twice_test')\n"
        "class EchoTwice(Environment):\n"
        "    def reset(self):\n        return self.row['prompt']\n"
        "    def step(self, text, finish_reason='stop'):\n"
        "        self.turn += 1\n"
        "        return TurnResult(observation=' again', reward=float('cat' in text), done=self.turn == 2)\n")
    config = EnvConfig(name="echo_twice_test", modules=(str(module),), tools=())
    env = make_environment(config, {"prompt": "Say cat."})
    assert env.reset() == "Say cat." and env.step("a cat") == TurnResult(" again", 1.0, False)
    assert "echo_twice_test" in ENVIRONMENTS


@pytest.mark.parametrize("overrides, path", [({"name": "nope"}, "name"), ({"tools": ["search"]}, "tools"),
                                             ({"tool_format": "xml"}, "tool_format"),
                                             ({"max_tokens": 100, "max_turn_tokens": 200}, "max_tokens"),
                                             ({"modules": ["no_such_module_xyz"]}, "modules")])
def test_bad_settings_fail_with_their_key(overrides, path):
    with pytest.raises(ConfigError, match=re.escape(path)):
        from_dict(EnvConfig, overrides)


def test_the_docs_env_section_is_a_valid_config():
    block = re.search(r"```yaml\n(env:.*?)```", DOCS.read_text(), re.S).group(1)
    section = yaml.safe_load(block)["env"]
    section["modules"] = []  # the docs' example names a user's module that does not exist here
    config = from_dict(EnvConfig, section)
    assert (config.name, config.tools, config.python.limits.wall_seconds) == ("tool_use", ("python",), 10)
