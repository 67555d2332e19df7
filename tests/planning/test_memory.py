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

REPO = Path(__file__).resolve().parents[2]
QWEN_7B = "configs/qwen25_7b_math_dataflow_tpu.yaml"


def _bytes_on(device, arrays):
    return sum(shard.data.nbytes for array in arrays for shard in array.addressable_shards if shard.device == device)


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
    assert plan.parts["weights"] == _bytes_on(devices[0], jax.tree.leaves(engine._params))
    assert plan.parts["KV pool"] == _bytes_on(devices[0], (*engine._cache.k, *engine._cache.v))


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
    assert main(["plan", "--config", QWEN_7B, "engine.tensor_parallel=1"]) == 1
    assert "rollout does not fit; turn: " in capsys.readouterr().err


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
