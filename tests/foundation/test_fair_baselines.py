"""Every benchmark's baseline runs in our dtype and recomputes nothing that ours keeps.

The settings are read from the benchmarks themselves (the keyword dicts they hand to TRL and
transformers, and our trainer's config), the way the libraries read them, defaults included, without
importing torch (benchmarks/baselines.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import baselines  # noqa: E402
import forward  # noqa: E402
import generate  # noqa: E402
import rl_curves  # noqa: E402
import train_step  # noqa: E402


def test_train_step_runs_trl_as_our_update_runs():
    ours = baselines.rlax_precision(train_step.trainer_config())
    trl = baselines.trl_precision(train_step.trl_grpo_options("unused", steps=1))
    assert trl == ours == {"dtype": "float32", "recomputation": False}


def test_rl_curves_runs_trl_as_the_recipe_trains():
    recipe = rl_curves.load_run_config(str(rl_curves.QUICKSTART_CONFIG), [])
    ours = baselines.rlax_precision(recipe.trainer)
    trl = baselines.trl_precision(rl_curves.trl_grpo_options(recipe, "unused", steps=1))
    assert trl == ours
    assert rl_curves.settings()["trl"]["dtype"] == rl_curves.settings()["rlax"]["dtype"]


@pytest.mark.parametrize("benchmark", [forward, generate], ids=["forward", "generate"])
def test_transformers_baselines_run_in_our_dtype_with_fused_attention(benchmark):
    assert baselines.transformers_precision(benchmark.TRANSFORMERS_LOAD) == {"dtype": baselines.OUR_DTYPE,
                                                                             "recomputation": False}
    assert benchmark.TRANSFORMERS_LOAD["attn_implementation"] == "sdpa"


def test_generate_baseline_keeps_its_kv_cache():
    assert generate.TRANSFORMERS_GENERATE["use_cache"] is True


def test_trl_left_at_its_defaults_is_caught():
    """GRPOConfig's own defaults (bf16 autocast, activation checkpointing) differ from ours: the reader
    sees them through options that leave them out, and through the deprecated name."""
    ours = baselines.rlax_precision(train_step.trainer_config())
    options = {k: v for k, v in train_step.trl_grpo_options("unused", steps=1).items()
               if k not in ("bf16", "activation_checkpointing")}
    assert baselines.trl_precision(options) == {"dtype": "bfloat16", "recomputation": True} != ours
    assert baselines.trl_precision({"bf16": False, "gradient_checkpointing": True})["recomputation"] is True
    assert baselines.trl_precision({"bf16": False, "gradient_checkpointing": True,
                                    "activation_checkpointing": False})["recomputation"] is False
    assert baselines.trl_precision({"bf16": False, "fp16": True})["dtype"] == "float16"


def test_the_settings_the_json_prints_name_dtype_and_recomputation():
    settings = baselines.trl_settings(train_step.trl_grpo_options("unused", steps=1))
    assert settings["dtype"] == "float32" and settings["recomputation"] is False
    assert settings["grpo_config"]["bf16"] is False and settings["grpo_config"]["activation_checkpointing"] is False
    assert settings["torch_threads"] >= 1


@pytest.mark.slow
def test_recorded_trl_defaults_are_the_installed_trls():
    """``baselines.TRL_GRPO_DEFAULTS`` is what GRPOConfig really defaults to (imports TRL, hence torch)."""
    trl = pytest.importorskip("trl")
    config = trl.GRPOConfig(output_dir="unused", use_cpu=True)
    assert baselines.trl_precision({})["recomputation"] == config.activation_checkpointing
    assert (baselines.trl_precision({})["dtype"] == "bfloat16") == config.bf16
    fair = trl.GRPOConfig(output_dir="unused", **baselines.TRL_GRPO_FAIR)
    assert (fair.bf16, fair.fp16, fair.activation_checkpointing, fair.gradient_checkpointing) == (False,) * 4
