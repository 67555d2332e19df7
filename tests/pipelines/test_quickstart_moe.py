"""The MoE quickstart end to end, as a reader runs it: ``rlax quickstart --config configs/quickstart_moe.yaml``
in a fresh folder, on Prism. Its report holds held-out pass@1 before and after, the policy it trained is
the mixture of experts upcycled at the run's start (routers and experts trained), and it learns the
story task as the dense quickstart does (README: pass@1 up by many standard errors in 30 steps)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.runners import cached_prism_binary
from rlax_core.models import from_pretrained

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

REPO = Path(__file__).resolve().parents[2]
CONFTEST_XLA_FLAGS = "--xla_force_host_platform_device_count=8"  # the tests' simulated mesh; a reader has the cores
# Measured (docs/models.md): pass@1 0.035 -> 0.551, 23.5 standard errors; the dense quickstart's rose 27.2
# in the same hour. 3 leaves room for a loaded machine's staler rollouts and still fails a run that did not learn.
MIN_GAIN_IN_SE = 3.0


def test_the_moe_quickstart_trains_the_upcycled_mixture_and_learns(tmp_path):
    output = tmp_path / "quickstart-moe"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(REPO), XLA_FLAGS=env.get("XLA_FLAGS", "").replace(CONFTEST_XLA_FLAGS, "").strip())
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "quickstart", "--config", "configs/quickstart_moe.yaml",
                           "--output", str(output)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]

    report = json.loads((output / "report.json").read_text())
    before, after = report["before"], report["after"]
    for stats in (before, after):
        assert 0 <= stats["pass@1"] <= 1 and stats["pass@1_se"] > 0 and stats["prompts"] == 64
    assert report["policy"] == {"architecture": "mixtral", "parameters": 756_672, "active_parameters": 426_432,
                                "num_experts": 4, "experts_per_token": 2}
    assert report["model"] == str(output / "run" / "upcycled_model") and report["rl"]["steps"] == 30
    assert "Policy: mixtral, 756,672 parameters (426,432 active per token: 2 of 4 experts per layer)." in \
        (output / "report.md").read_text()
    assert report["pass@1_gain_in_se"] >= MIN_GAIN_IN_SE, (before["pass@1"], after["pass@1"])
    assert after["pass@1"] >= report["target_pass@1"], (before["pass@1"], after["pass@1"])

    # The saved policy is sparse: four experts a layer, and RL moved its routers away from the upcycled ones.
    start, final = from_pretrained(output / "run" / "upcycled_model"), from_pretrained(output / "final_model")
    config = json.loads((output / "final_model" / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"] and config["num_local_experts"] == 4
    assert final.config == start.config and final.params["layers"]["moe"]["gate_proj"].shape[1] == 4
    routers = [np.asarray(m.params["layers"]["moe"]["router"]) for m in (start, final)]
    assert not np.allclose(*routers)
