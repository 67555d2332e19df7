"""``configs/quickstart_sql.yaml`` end to end on the CPU, its header's commands run as written, in order:
curate the shipped sql_tiny task (the Spider reader), evaluate stories260K, three GRPO steps with the
``sql`` reward, evaluate before and after side by side. The report shows execution accuracy by level.

stories260K cannot write SQL: the accuracy is expected near 0 both times. The test checks that every
part ran and reported honestly, not that the model learned.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines.test_documented_commands import recipe_header_commands
from tests.conftest import REPO_ROOT

RECIPE = REPO_ROOT / "configs" / "quickstart_sql.yaml"


def test_the_header_lists_curate_to_evaluate():
    commands = recipe_header_commands(RECIPE)
    assert [c.split()[1] for c in commands] == ["curate", "evaluate", "launch", "evaluate"]


@pytest.mark.slow
@pytest.mark.long  # curate, evaluate, launch (3 steps), evaluate: ~8 minutes on 2 loaded cores
def test_quickstart_sql_runs_end_to_end_and_reports_execution_accuracy_before_and_after(tmp_path):
    (tmp_path / "configs").symlink_to(REPO_ROOT / "configs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(REPO_ROOT),
               XLA_FLAGS=env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "").strip())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this interpreter's rlax
    script = "\n".join(["set -euo pipefail", *(c.partition("  #")[0] for c in recipe_header_commands(RECIPE))])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, f"{script}\n---\n{(done.stdout + done.stderr)[-4000:]}"

    stats = json.loads((tmp_path / "runs/sql/curated/stats.json").read_text())
    assert stats["kept"] > 100 and stats["consistent"]
    for folder, models in (("eval_before", ["stories260K"]), ("eval_after", ["after", "before"])):
        report = json.loads((tmp_path / f"runs/sql/{folder}/report.json").read_text())
        assert sorted(report["models"]) == models
        for model in models:
            result = report["models"][model]["sql_tiny_heldout"]
            assert 0.0 <= result["overall"]["execution_accuracy"] <= 1.0
            assert set(result["by_level"]) == {"1_single_table", "2_join", "3_grouping", "4_nesting"}
        text = (tmp_path / f"runs/sql/{folder}/report.md").read_text()
        assert "## Execution accuracy (text-to-SQL)" in text and "| sql_tiny_heldout | 4_nesting |" in text
    weights = sorted(p.name for p in (tmp_path / "runs/sql/loop/weights").iterdir() if p.name.startswith("step_"))
    assert weights[-1] == "step_00000003"  # three GRPO steps published
