"""A recipe's stages: the order a run can follow, refused in one line otherwise (pipelines.stages)."""

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import load_run_config
from pipelines.stages import DEFAULT_STAGES, check_stages, warm_start
from rlax_core.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_warm_recipe_names_its_stages_and_the_plain_quickstart_none():
    warm = load_run_config("configs/quickstart_warm.yaml")
    assert warm.stages == ("curate", "rft", "sft", "filter", "rl", "evaluate") and warm_start(warm.stages)
    assert dict(warm.stage_overrides)["sft"][0] == "trainer.total_steps=12"
    plain = load_run_config("configs/quickstart.yaml")
    assert plain.stages == () and DEFAULT_STAGES == ("curate", "filter", "rl", "evaluate")
    assert not warm_start(DEFAULT_STAGES)
    learned = load_run_config("configs/quickstart_rm.yaml")
    assert learned.stages == ("curate", "filter", "rm", "rl", "evaluate") and not warm_start(learned.stages)


@pytest.mark.parametrize("stages, said", [
    (["curate", "rft", "sft", "bogus", "rl"], "unknown stage 'bogus'; the stages are curate, rft, rm, sft, filter, rl, evaluate"),
    (["curate", "rl", "rm", "evaluate"], "rl comes before rm"),
    (["rm", "rl"], "rm samples the curated prompts: list curate before rm"),
    (["curate", "rft", "rl", "sft", "evaluate"], "rl comes before sft"),
    (["curate", "sft", "rl"], "sft has no data: list rft before sft"),
    (["rft", "sft", "rl"], "rft samples the curated prompts: list curate before rft"),
    (["curate", "rl", "rl"], "stage rl is listed more than once"),
])
def test_a_stage_list_the_run_cannot_follow_is_refused_by_its_key(stages, said):
    with pytest.raises(ConfigError, match="^stages: ") as error:
        check_stages(stages)
    assert said in str(error.value) and "\n" not in str(error.value)


def test_a_users_sft_set_needs_no_rft_stage_and_overrides_name_only_listed_stages():
    check_stages(["curate", "sft", "rl", "evaluate"], sft_data="mine.jsonl")
    with pytest.raises(ConfigError, match="^stage_overrides.sft: not a stage of this run"):
        check_stages(["curate", "rl"], {"sft": ["trainer.total_steps=3"]})


@pytest.mark.parametrize("command", ["quickstart", "launch"])  # rlax launch runs a recipe's stages too
def test_the_commands_say_a_bad_stage_list_in_one_line(command, tmp_path):
    bad = ["--config", "configs/quickstart_warm.yaml", "stages=[curate,rft,rl,sft,evaluate]"]
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", command, "--output", str(tmp_path / "out"), *bad],
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"rlax {command}: config error: stages: ") and "rl comes before sft" in lines[0], lines
