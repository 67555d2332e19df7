"""The memory planner counts a reward model scoring on the rollout chips: its weights and one forward's
activations, before the KV pool takes what is left; where they do not fit, the config is refused with
the numbers."""

from pathlib import Path

import pytest

from pipelines.config import load_run_config
from pipelines.plan import memory_plans
from rlax_core.config import ConfigError
from rlax_core.models.checkpoint import read_model_config
from rlax_core.models.config import PUBLISHED_CONFIGS, toy_config
from rlax_core.planning.memory import scoring_model_parts
from rlax_core.training.reward_model import reward_model_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ASSETS = CONFIGS.parent / "pipelines" / "assets"
WITH_RM = ["loop.rewards.terms={reward_model: 1.0, story_word: 0.0}"]


def test_a_reward_models_parts_are_its_weights_and_one_dense_forward():
    model = reward_model_config(toy_config())
    parts = scoring_model_parts(model, batch=4, length=32, dtype="bfloat16")
    assert parts["reward model weights"] == model.num_params * 2
    per_token = 3 * 64 + (4 + 2 * 2) * 16 + 3 * 128  # residual/norm/out, q/k/v, gate/up/product
    assert parts["reward model activations"] == 4 * 32 * 2 * per_token + 2 * 4 * 4 * 32 * 32 * 4


def test_the_rollout_plan_holds_the_reward_model_beside_the_engine():
    plain = load_run_config(CONFIGS / "quickstart.yaml")
    judged = load_run_config(CONFIGS / "quickstart.yaml", [*WITH_RM, "loop.rewards.reward_model.path=assets:stories260K",
                                                           "loop.rewards.reward_model.batch_size=8"])
    (before,), (after,) = memory_plans(plain, roles=("rollout",)), memory_plans(judged, roles=("rollout",))
    assert "reward model weights" not in before.parts
    assert after.parts["reward model weights"] > 0 and after.parts["reward model activations"] > 0
    assert after.total == before.total + after.parts["reward model weights"] + after.parts["reward model activations"]
    assert after.fits


def test_a_7b_reward_model_beside_the_7b_math_policy_on_v5e_is_refused_with_the_numbers():
    # Whole on one 16 GiB v5e chip, 7B bf16 weights leave no room for the engine's KV pool.
    assert "Qwen2.5-7B" in PUBLISHED_CONFIGS
    with pytest.raises(ConfigError, match=r"engine\.num_pages: auto: .* reward model weights 13\.17 GiB") as caught:
        load_run_config(CONFIGS / "qwen25_7b_math_dataflow_tpu.yaml",
                        ["loop.rewards.terms={reward_model: 1.0, math: 0.0}",
                         "loop.rewards.reward_model.path=gs://bucket/models/Qwen2.5-7B",
                         "loop.rewards.reward_model.dtype=bfloat16"])
    assert "\n" not in str(caught.value) and "turn: reward model weights" in str(caught.value)


# On-policy distillation's teacher is placed like a reward model (rewards.distillation.placement).
WITH_TEACHER = ["loop.rewards.distillation.teacher=assets:stories260K", "loop.rewards.distillation.batch_size=8",
                "loop.rewards.distillation.max_length=128"]


def test_a_teachers_parts_add_its_logits_to_a_reward_models():
    teacher, scorer = toy_config(), reward_model_config(toy_config())
    parts = scoring_model_parts(teacher, batch=4, length=32, dtype="bfloat16", name="teacher")
    scored = scoring_model_parts(scorer, batch=4, length=32, dtype="bfloat16")
    assert parts["teacher weights"] == teacher.num_params * 2
    # The same layers' activations, and the float32 logits and their log-softmax [B, T, V].
    assert parts["teacher activations"] == scored["reward model activations"] + 2 * 4 * 32 * 256 * 4


def test_the_rollout_plan_holds_the_teacher_beside_the_engine_and_its_own_stage_holds_it_there():
    plain = load_run_config(CONFIGS / "quickstart.yaml")
    taught = load_run_config(CONFIGS / "quickstart.yaml", WITH_TEACHER)
    (before,), (after,) = memory_plans(plain, roles=("rollout",)), memory_plans(taught, roles=("rollout",))
    teacher = scoring_model_parts(read_model_config(str(ASSETS / "stories260K" / "stories260K.bin")), 8, 128,
                                  "float32", name="teacher")
    assert {name: after.parts[name] for name in teacher} == teacher
    assert after.total == before.total + sum(teacher.values()) and after.fits
    # Placed on a stage of its own, the rollout chips hold none of it and the stage's chip holds it.
    staged = load_run_config(CONFIGS / "quickstart.yaml", [*WITH_TEACHER, "loop.rewards.distillation.placement=own_stage"])
    rollout, stage = memory_plans(staged, roles=("rollout", "reward_model"))
    assert rollout.total == before.total and stage.role == "reward_model" and stage.parts == teacher


def test_a_7b_teacher_beside_the_7b_math_policy_on_v5e_is_refused_with_the_numbers():
    with pytest.raises(ConfigError, match=r"engine\.num_pages: auto: .* teacher weights 14\.19 GiB") as caught:
        load_run_config(CONFIGS / "qwen25_7b_math_dataflow_tpu.yaml",
                        ["loop.rewards.distillation.teacher=gs://bucket/models/Qwen2.5-7B",
                         "loop.rewards.distillation.dtype=bfloat16"])
    assert "\n" not in str(caught.value) and "loop.rewards.distillation.dtype" in str(caught.value)
