"""The warm-started quickstart end to end, as a reader runs it (``configs/quickstart_warm.yaml``): the
base model makes RFT data on the story task's training prompts, SFT trains on it, RL starts from the
SFT job's final version, and the plain RL runs beside it. Shortened where no claim depends on it: 16
prompts for the difficulty filter, 6 RL steps a run (the recipe's RFT and SFT run in full). Checked from
the report: SFT lowers the held-out NLL of held-out verified samples and raises held-out pass@1 before
any RL; the report holds pass@1 of the base, after SFT and after RL, and each run's steps to the target."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from pipelines.runners import cached_prism_binary

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

REPO = Path(__file__).resolve().parents[2]
CONFTEST_XLA_FLAGS = "--xla_force_host_platform_device_count=8"
RL_STEPS = 6
# Measured (docs/post_training.md): pass@1 0.04 -> 0.30 after 12 SFT steps, about 12 standard errors.
# 3 still fails an SFT that did not teach the task.
MIN_SFT_GAIN_IN_SE = 3.0


def test_the_warm_quickstart_shows_sft_helps_before_rl_and_compares_with_the_cold_run(tmp_path):
    output = tmp_path / "quickstart-warm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(REPO), XLA_FLAGS=env.get("XLA_FLAGS", "").replace(CONFTEST_XLA_FLAGS, "").strip())
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "quickstart", "--config", "configs/quickstart_warm.yaml",
                           "--output", str(output), "--filter-prompts", "16", "--curve-every", "3",
                           f"trainer.total_steps={RL_STEPS}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=2400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    report = json.loads((output / "report.json").read_text())
    base, sft, after = report["before"], report["sft"], report["after"]
    assert report["stages"] == ["curate", "rft", "sft", "filter", "rl", "evaluate"]
    assert report["rft"]["sft_examples"] > 50 and report["rft"]["prompts"] == 256

    # SFT lowers the held-out NLL of the held-out verified samples ...
    assert sft["heldout_examples"] >= 5 and sft["steps"] == 12
    assert sft["heldout_nll_after"] < sft["heldout_nll_before"], sft
    # ... and raises held-out pass@1 before any RL.
    gain = (sft["pass@1"] - base["pass@1"]) / math.sqrt(sft["pass@1_se"] ** 2 + base["pass@1_se"] ** 2)
    assert gain >= MIN_SFT_GAIN_IN_SE, (base["pass@1"], sft["pass@1"])

    # RL started from the SFT job's final export: the warm run's version 0 is that model.
    from rlax_core.models import from_pretrained
    from rlax_core.weights.store import WeightStore, WeightStoreConfig

    exported = from_pretrained(sft["model"]).params
    assert sft["model"] == str(output / "sft" / "hf" / "step_00000012")
    with WeightStore(WeightStoreConfig(root=str(output / "run" / "weights"), run_id="quickstart_warm")) as store:
        version0 = store.load(0)
        assert store.latest() == RL_STEPS
    assert jax.tree.structure(version0) == jax.tree.structure(exported)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), version0, exported)

    # Each run's curve and steps to the target, beside each other.
    for name, start in (("cold", base), ("warm", sft)):
        curve = report[name]["curve"]
        assert [p["step"] for p in curve] == [0, 3, 6] and curve[0]["pass@1"] == start["pass@1"]
        reached = report[name]["steps_to_target"]
        first = next((p["step"] for p in curve if p["pass@1"] >= report["target_pass@1"]), None)
        assert reached == first and report[name]["final_pass_at_1"] == curve[-1]["pass@1"]
    assert report["warm"]["curve"][-1]["pass@1"] == after["pass@1"]
    text = (output / "report.md").read_text()
    assert "## Warm start: RFT -> SFT -> RL" in text and "after SFT, before any RL" in text
    assert f"{sft['heldout_nll_before']:.3f} before SFT -> {sft['heldout_nll_after']:.3f} after" in text
    assert (output / "final_model" / "config.json").is_file()
