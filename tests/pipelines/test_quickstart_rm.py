"""``configs/quickstart_rm.yaml`` end to end, its header's command run as written: the run makes its own
reward model before RL (rlax rft's pairs of the story task's training prompts, then rlax rm), GRPO
trains stories260K on that model's score alone, and held-out pass@1 under the story verifier (which
pays nothing) still rises by at least 5 standard errors. The report shows the reward model's score
beside the verifier's pass rate, per step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.pipelines.test_documented_commands import recipe_header_commands

RECIPE = REPO_ROOT / "configs" / "quickstart_rm.yaml"


def test_the_header_runs_the_quickstart_with_the_reward_model_recipe():
    command, = recipe_header_commands(RECIPE)
    assert command.startswith("rlax quickstart --config configs/quickstart_rm.yaml --output ")


@pytest.mark.slow
@pytest.mark.long  # rft pairs (448 prompts), rlax rm, 30 GRPO steps on its score, evaluations: 11 minutes at load 8-25
def test_rl_on_the_reward_model_alone_raises_held_out_pass_at_1_by_5_standard_errors(tmp_path):
    (tmp_path / "configs").symlink_to(REPO_ROOT / "configs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(REPO_ROOT),
               XLA_FLAGS=env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "").strip())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this interpreter's rlax
    command, = recipe_header_commands(RECIPE)
    done = subprocess.run(["bash", "-c", f"set -euo pipefail\n{command}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = tmp_path / "runs" / "quickstart-rm"
    report = json.loads((out / "report.json").read_text())
    assert report["pass@1_gain_in_se"] >= 5.0, (report["before"]["pass@1"], report["after"]["pass@1"])
    rm_metrics = [json.loads(line) for line in (out / "rm" / "metrics" / "metrics.jsonl").read_text().splitlines()]
    held_out = [row["train/heldout_pair_accuracy"] for row in rm_metrics if "train/heldout_pair_accuracy" in row]
    assert held_out[-1] > held_out[0]
    assert (out / "rm" / "reward_model" / "reward_stats.json").is_file()
    steps = report["learned_reward"]
    assert len(steps) >= 10 and all(s["pass_rate"] is not None for s in steps)
    text = (out / "report.md").read_text()
    assert "## The reward model's score and the verifier, per step" in text
    assert "| step | reward model score (normalised) | verifier pass rate | correlation |" in text
