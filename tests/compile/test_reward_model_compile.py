"""The TPU lane compiles a reward model's forward for the chips that run it: on a rollout chip beside
the engine (the rollout role: XLA's bytes per chip are the engine's and the reward model's together),
or on a chip of its own scoring stage (the reward_model role). A small recipe, the forward alone."""

from __future__ import annotations

import pytest

from tests.support.rlax_compile import run_compile

pytestmark = pytest.mark.tpu

RECIPE = "tests/fixtures/compile/small_qwen2_tpu.yaml"
# The small Qwen2 shape read as a reward model (the planner and the compiler give it a score head).
WITH_RM = ["loop.rewards.terms={reward_model: 1.0, task: 0.0}",
           "loop.rewards.reward_model.path=tests/fixtures/compile/small_qwen2", "loop.rewards.reward_model.dtype=bfloat16",
           "loop.rewards.reward_model.batch_size=8", "loop.rewards.reward_model.max_length=256"]


def test_the_reward_models_forward_compiles_on_a_rollout_chip_beside_the_engine(tmp_path):
    report = run_compile(tmp_path, RECIPE, [*WITH_RM, "--roles", "rollout", "--programs", "reward model,decode"])
    forward, = [p for p in report["programs"] if p["program"].startswith("reward model forward")]
    assert forward["program"] == "reward model forward 8x256" and forward["compiled"] and forward["role"] == "rollout"
    decode = [p for p in report["programs"] if p["program"].startswith("decode")]
    assert decode and all(p["compiled"] for p in decode)
    rollout = report["roles"]["rollout"]
    # The role's figure holds the engine's largest program and the reward model's forward together.
    assert rollout["xla_bytes_per_chip"] >= max(p["peak_bytes"] for p in decode) + forward["peak_bytes"]
    assert rollout["xla_bytes_per_chip"] <= rollout["hbm_bytes_per_chip"]


def test_on_its_own_stage_the_reward_model_is_its_own_role(tmp_path):
    report = run_compile(tmp_path, RECIPE, [*WITH_RM, "loop.rewards.reward_model.placement=own_stage",
                                            "hardware.reward_model={chip: v5p, chips_per_host: 4, hosts: 1}",
                                            "--roles", "rollout,reward_model", "--programs", "reward model"])
    forward, = report["programs"]
    assert forward["role"] == "reward_model" and forward["compiled"] and forward["topology"].startswith("v5p")
    assert report["roles"]["reward_model"]["xla_bytes_per_chip"] == forward["peak_bytes"]


def test_a_distillation_teachers_forward_compiles_on_a_rollout_chip_as_a_reward_models_does(tmp_path):
    # The teacher is placed like a reward model: its forward (each token's log-prob) joins the rollout
    # role, and the role's XLA bytes hold the engine's largest program and the teacher's together.
    teacher = ["loop.rewards.distillation.teacher=tests/fixtures/compile/small_qwen2",
               "loop.rewards.distillation.dtype=bfloat16", "loop.rewards.distillation.batch_size=8",
               "loop.rewards.distillation.max_length=256"]
    report = run_compile(tmp_path, RECIPE, [*teacher, "--roles", "rollout", "--programs", "teacher,decode"])
    forward, = [p for p in report["programs"] if p["program"].startswith("teacher forward")]
    assert forward["program"] == "teacher forward 8x256" and forward["compiled"] and forward["role"] == "rollout"
    decode = [p for p in report["programs"] if p["program"].startswith("decode")]
    assert decode and all(p["compiled"] for p in decode)
    rollout = report["roles"]["rollout"]
    assert rollout["xla_bytes_per_chip"] >= max(p["peak_bytes"] for p in decode) + forward["peak_bytes"]
    assert rollout["xla_bytes_per_chip"] <= rollout["hbm_bytes_per_chip"]
