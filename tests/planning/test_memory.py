"""The memory planner: its byte counts are what a real engine places, every recipe fits its declared
hardware, and a config that does not fit is refused at launch with the numbers and the knob to turn."""

import dataclasses
import re
from pathlib import Path

import jax
import pytest

from pipelines.cli import main
from pipelines.config import load_run_config, load_section
from pipelines.plan import check_memory, markdown_table, memory_plans, recipe_paths
from rlax_core.config import ConfigError
from rlax_core.inference.config import EngineConfig
from rlax_core.inference.engine import Engine
from rlax_core.models.checkpoint import read_model_config
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import init_params
from rlax_core.planning.hardware import SliceSpec
from rlax_core.planning.memory import plan_rollout, plan_trainer
from tests.support.device_bytes import bytes_on

REPO = Path(__file__).resolve().parents[2]
QWEN_7B = "configs/qwen25_7b_math_dataflow_tpu.yaml"


@pytest.mark.skipif(jax.local_device_count() < 4, reason="needs 4 devices (tests/conftest.py)")
@pytest.mark.parametrize("tensor_parallel", [1, 4])
def test_the_plans_weights_and_kv_pool_are_what_an_engine_places_per_device(tensor_parallel):
    # 2 KV heads: with 4 devices the cache cannot split by head and stays whole on each, as planned.
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=2, head_dim=8, qk_norm=True)
    config = EngineConfig(num_slots=2, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                          prefill_buckets=(8,), attention_impl="window", tensor_parallel=tensor_parallel)
    devices = jax.local_devices()[:tensor_parallel]
    engine = Engine(config, model, init_params(model, jax.random.key(0)),
                    **({"devices": devices} if tensor_parallel > 1 else {"device": devices[0]}))
    plan = plan_rollout(model, config, SliceSpec(chip="cpu", chips_per_host=4, memory_gib=1), "float32")
    assert plan.parts["weights"] == bytes_on(devices[0], jax.tree.leaves(engine.params))
    assert plan.parts["KV pool"] == bytes_on(devices[0], (*engine.cache.k, *engine.cache.v))


GIB, MIB = 2**30, 2**20
# XLA's bytes per chip of every role `rlax compile` has compiled (docs/compile.md, docs/memory.md): the
# TPU recipes' roles, and the CI lane's small recipe (its figures are the fixture's,
# tests/fixtures/compile/small_qwen2_tpu.compiled.json; with the chips swapped, one run's).
COMPILED = [
    # num_pages: auto, one resident version (engine.on_new_version continue): the pool fills the chip.
    ("configs/qwq32b_code_tpu_1024.yaml", [], "rollout", 28.47 * GIB),
    ("configs/qwq32b_code_tpu_1024.yaml", [], "trainer", 32.96 * GIB),
    ("configs/qwen25_7b_math_dataflow_tpu.yaml", [], "rollout", 14.36 * GIB),
    ("configs/qwen25_7b_math_dataflow_tpu.yaml", [], "trainer", 27.36 * GIB),
    ("configs/qwq32b_code_lora_tpu.yaml", [], "rollout", 28.39 * GIB),
    ("configs/qwq32b_code_lora_tpu.yaml", [], "trainer", 42.81 * GIB),
    # A mixture of experts: the engine tensor_parallel 2 x expert_parallel 4, the trainer fsdp 4 x expert 8.
    ("configs/qwen3_30b_a3b_math_tpu.yaml", [], "rollout", 30754530528),
    ("configs/qwen3_30b_a3b_math_tpu.yaml", [], "filter", 28791171808),
    ("configs/qwen3_30b_a3b_math_tpu.yaml", [], "trainer", 40.81 * GIB),
    # Context parallelism with splash chunks (docs/compile.md, "The 65,536-token QwQ-32B variant").
    ("configs/qwq32b_code_tpu_1024_65k.yaml", ["trainer.mesh.context=2", "trainer.mesh.fsdp=16"], "trainer",
     47958769792),
    ("tests/fixtures/compile/small_qwen2_tpu.yaml", [], "rollout", 17421312),
    ("tests/fixtures/compile/small_qwen2_tpu.yaml", [], "trainer", 104943488),
    ("tests/fixtures/compile/small_qwen2_tpu.yaml", ["hardware.rollout.chip=v5p"], "rollout", 18662112),
    ("tests/fixtures/compile/small_qwen2_tpu.yaml", ["hardware.trainer.chip=v5e", "trainer.mesh.fsdp=1",
                                                     "trainer.mesh.tensor=4"], "trainer", 83.5 * MIB),
]


@pytest.mark.parametrize("recipe, overrides, role, xla", COMPILED)
def test_the_plan_is_on_the_safe_side_of_every_role_xla_compiled(recipe, overrides, role, xla):
    """A plan under XLA's figure would pass a recipe that does not fit; the QwQ trainer's was 12%
    under before the planner counted remat's recomputed layer and the flash kernel's residuals."""
    [plan] = [plan for plan in memory_plans(load_run_config(REPO / recipe, overrides), (role,)) if plan.role == role]
    assert 1.0 <= plan.total / xla <= 1.6, f"{recipe} {role}: planner {plan.total / GIB:.2f} GiB, XLA {xla / GIB:.2f} GiB"


def test_the_compile_fixture_holds_the_xla_figures_this_test_checks():
    import json

    fixture = json.loads((REPO / "tests/fixtures/compile/small_qwen2_tpu.compiled.json").read_text())["roles"]
    assert {role: figures["xla_bytes_per_chip"] for role, figures in fixture.items()} == \
        {role: xla for recipe, overrides, role, xla in COMPILED if "small" in recipe and not overrides}


def test_every_recipe_fits_its_declared_hardware():
    recipes = {path.name: path for path in recipe_paths()}
    assert {"quickstart.yaml", "qwen25_7b_math_dataflow_tpu.yaml", "qwq32b_code_tpu_1024.yaml"} <= set(recipes)
    for name, path in recipes.items():
        config = load_run_config(path)
        assert config.hardware is not None, f"{name} declares no hardware: section"
        plans = memory_plans(config)
        # A run recipe plans its fleet and its trainer; a recipe for one command, that command's workers.
        declared = {role for role in ("rollout", "trainer", "filter") if getattr(config.hardware, role) is not None}
        assert declared and {plan.role for plan in plans} >= declared, name
        for plan in plans:
            assert plan.fits, f"{name}: {plan.describe()}"


def test_the_gpu_filter_recipe_plans_its_engine_against_its_declared_l4_workers():
    config = load_section(REPO / "configs" / "filter_dataflow_gpu.yaml", [], "filter")
    plans = memory_plans(config)
    assert [(plan.role, plan.chip) for plan in plans] == [("filter", "l4")]
    assert plans[0].fits, plans[0].describe()
    # rlax filter makes the same check as it starts: a pool twice the size does not fit one L4.
    with pytest.raises(ConfigError, match="filter"):
        check_memory(load_section(REPO / "configs" / "filter_dataflow_gpu.yaml",
                                  ["generation.engine.num_pages=16384"], "filter"), roles=("filter",))


def test_an_oversize_config_is_refused_with_the_numbers_and_the_knob():
    # The 7B recipe as it was: one v5e chip per replica and a 28 GiB pool.
    config = load_run_config(QWEN_7B, ["engine.tensor_parallel=1", "engine.num_pages=8192"])
    with pytest.raises(ConfigError) as refused:
        check_memory(config, roles=("rollout",))
    message = str(refused.value)
    assert "rollout: Qwen2.5-7B on 64 x v5e" in message and "KV pool 28.00 GiB" in message
    assert "weights 14.19 GiB" in message and "of 14.40 GiB usable" in message and "does not fit" in message
    assert "engine.num_pages" in message and "engine.tensor_parallel" in message


def test_launch_commands_refuse_before_starting(capsys):
    # rlax train loads its config, plans, and stops: nothing is read from or written to gs://.
    code = main(["train", "--config", QWEN_7B, "trainer.micro_batches=1", "trainer.remat=false"])
    assert code == 2
    error = capsys.readouterr().err
    assert "trainer: Qwen2.5-7B on 16 x v5p" in error and "trainer.micro_batches" in error
    assert main(["plan", "--config", QWEN_7B, "engine.tensor_parallel=1", "engine.num_pages=4096"]) == 1
    assert "rollout does not fit; turn: " in capsys.readouterr().err
    # num_pages: auto finds no room beside 14.19 GiB of weights on a 16 GiB chip: refused as the config loads.
    assert main(["plan", "--config", QWEN_7B, "engine.tensor_parallel=1"]) == 2
    assert "engine.num_pages: auto" in capsys.readouterr().err


def test_a_replica_must_fit_within_one_host_and_the_trainer_mesh_within_its_chips():
    model = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=4,
                        num_kv_heads=4, head_dim=4)
    with pytest.raises(ConfigError, match="does not divide hardware.rollout.chips_per_host=4"):
        plan_rollout(model, EngineConfig(tensor_parallel=8), SliceSpec("v5e", chips_per_host=4), "bfloat16")
    with pytest.raises(ConfigError, match="needs 8 devices.*declares 4 chips"):
        config = load_run_config(QWEN_7B).trainer
        plan_trainer(model, dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, fsdp=2)),
                     SliceSpec("v5p", chips_per_host=4), rows_per_step=8)
    with pytest.raises(ConfigError, match="unknown chip 'v7'"):
        SliceSpec("v7")
    with pytest.raises(ConfigError, match="a cpu slice needs memory_gib"):
        SliceSpec("cpu")


def test_docs_memory_table_is_the_commands_output(capsys):
    assert main(["plan", "--recipes", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    rows = [(path.name, plan) for path in recipe_paths() for plan in memory_plans(load_run_config(path))]
    assert table == markdown_table(rows)
    docs = (REPO / "docs" / "memory.md").read_text()
    assert table in docs, "docs/memory.md: paste the output of `rlax plan --recipes --markdown`"
    assert re.search(r"rlax plan --recipes --markdown", docs)


def test_auto_pages_fill_the_qwq_chips_and_every_slot_decodes_at_the_recipes_mean_response(capsys):
    # num_pages: auto and loop.response_lengths {mean: 8192, cap: 32768}: docs/memory.md and docs/fleet.md.
    assert main(["plan", "--config", "configs/qwq32b_code_tpu_1024.yaml"]) == 0
    out = capsys.readouterr().out
    assert "rollout KV pool 5,314 pages x 128 = 680,192 tokens per replica" in out
    assert "64 of 64 slots decode at once with pages on demand" in out and "21 reserving whole budgets" in out
    assert "incoming weights" not in out.split("rollout:")[1].split("\n")[0]  # continue: one resident version


def test_a_context_parallel_splash_trainer_plans_flash_chunks_not_their_scores():
    """The 65,536-token QwQ trainer over context 2: with splash chunks (models.context) a chip holds no
    [heads, T / 2, T] scores and the plan fits, under the whole-row plan (half the tokens per chip);
    the same mesh with dense chunks plans the scores and does not fit."""
    recipe, mesh = REPO / "configs/qwq32b_code_tpu_1024_65k.yaml", ["trainer.mesh.context=2", "trainer.mesh.fsdp=16"]
    plan = lambda overrides: [p for p in memory_plans(load_run_config(recipe, overrides), ("trainer",))][0]  # noqa: E731
    whole, splash, dense = plan([]), plan(mesh), plan([*mesh, "trainer.attention=dense"])
    assert splash.total < whole.total and splash.fits
    assert dense.total > 2 * whole.total and not dense.fits
