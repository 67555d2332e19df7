"""The rollouts' reward is the recipe's to name: none is assumed, and a run that names none does not start."""

from pathlib import Path

import pytest
import yaml

from pipelines.cli import main
from pipelines.config import load_run_config
from pipelines.quickstart import rl_settings
from rlax_core.config import ConfigError, read_yaml
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.support.rollout_spec import rollout_spec

REPO = Path(__file__).resolve().parents[2]
MATH_RECIPE = REPO / "configs" / "qwen25_1p5b_math_dataflow_gpu.yaml"


def _without_reward(recipe: Path, folder: Path) -> Path:
    """``recipe`` with its ``loop.rewards`` taken out (its base named by absolute path)."""
    data = yaml.safe_load(recipe.read_text())
    assert "rewards" in data["loop"], "the recipe names its reward: the test would prove nothing"
    del data["loop"]["rewards"]
    data["base"] = str(recipe.parent / data["base"])
    path = folder / recipe.name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("command", ["rollout", "launch"])
def test_a_math_recipe_without_a_reward_refuses_to_start_naming_the_key(command, tmp_path, capsys):
    recipe = _without_reward(MATH_RECIPE, tmp_path)
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 2), train_set)
    output = tmp_path / "run"
    code = main([command, "--config", str(recipe), "--train-set", str(train_set), f"run.output_dir={output}"])
    assert code == 2
    error = capsys.readouterr().err
    assert "loop.rewards" in error and "{task: 1.0}" in error, error
    assert not output.exists()  # refused before anything started


def test_a_rollout_spec_refuses_a_loop_without_a_reward():
    with pytest.raises(ConfigError, match=r"loop\.rewards"):
        rollout_spec(rewards=None)


def test_the_recipes_of_the_loop_name_their_reward():
    for name in ("quickstart.yaml", "qwen25_1p5b_math_dataflow_gpu.yaml", "qwen25_7b_math_dataflow_tpu.yaml",
                 "qwq32b_code_tpu_1024.yaml", "qwq32b_code_lora_tpu.yaml"):
        assert "rewards" in read_yaml(REPO / "configs" / name)["loop"], name  # (base: followed)
    assert load_run_config(REPO / "configs" / "quickstart.yaml").loop.named_rewards().terms == {"story_word": 1.0}
    assert load_run_config(MATH_RECIPE).loop.named_rewards().terms == {"task": 1.0}


def test_the_quickstart_report_reads_its_settings_from_the_run_config():
    run_config = load_run_config(REPO / "configs" / "quickstart.yaml",
                                 ["loop.sampling.samples_per_prompt=4", "algorithm.preset=dapo", "trainer.total_steps=3",
                                  "algorithm.overlong_max_length=64", "algorithm.overlong_cache_length=16"])
    settings = rl_settings(run_config)
    assert (settings["samples_per_prompt"], settings["algorithm"], settings["steps"]) == (4, "dapo", 3)
