"""The planner's mixture of experts: expert weights and their optimizer state per chip are what the trainer
places on an expert-parallel mesh, and the expert axis divides them."""

import dataclasses
from pathlib import Path

import jax
import pytest

from rlax_core.config import ConfigError
from rlax_core.models.config import MoeConfig, toy_moe_config
from rlax_core.parallel.mesh import make_mesh
from rlax_core.planning.hardware import SliceSpec
from rlax_core.planning.memory import plan_rollout, plan_trainer
from rlax_core.inference.config import EngineConfig
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.config import MeshConfig, TrainerConfig
from rlax_core.training.step import Trainer
from tests.support.device_bytes import bytes_on

MODEL = toy_moe_config(moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=64), num_layers=2)
HARDWARE = SliceSpec(chip="cpu", chips_per_host=8, memory_gib=1)


@pytest.mark.skipif(jax.local_device_count() < 8, reason="needs 8 devices (tests/conftest.py)")
@pytest.mark.parametrize("mesh", [MeshConfig(fsdp=1, expert=8), MeshConfig(fsdp=2, expert=2, tensor=2)])
def test_the_plan_counts_the_expert_weights_and_optimizer_state_the_trainer_places(mesh):
    config = TrainerConfig(max_seq_len=16, mesh=mesh)
    devices = jax.local_devices()[:8]
    trainer = Trainer(MODEL, AlgorithmConfig(), config, make_mesh(mesh, devices))
    state = trainer.init_state()
    plan = plan_trainer(MODEL, config, HARDWARE, rows_per_step=16)
    assert plan.parts["parameters"] == bytes_on(devices[0], jax.tree.leaves(state.params))
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert plan.parts["optimizer state"] == bytes_on(devices[0], moments)
    experts = state.params["layers"]["moe"]["gate_proj"]
    assert bytes_on(devices[0], [experts]) * mesh.expert * mesh.tensor * mesh.fsdp == experts.nbytes


def test_the_expert_axis_divides_the_experts_and_the_rows_per_chip():
    replicated = plan_trainer(MODEL, TrainerConfig(max_seq_len=16, mesh=MeshConfig(data=8, fsdp=1)), HARDWARE,
                              rows_per_step=16)
    split = plan_trainer(MODEL, TrainerConfig(max_seq_len=16, mesh=MeshConfig(fsdp=1, expert=8)), HARDWARE,
                         rows_per_step=16)
    expert_bytes = 2 * 3 * 8 * MODEL.hidden_size * 64 * 4  # 2 layers x gate/up/down x 8 experts, float32
    assert replicated.parts["parameters"] - split.parts["parameters"] == expert_bytes * 7 // 8
    assert replicated.parts["optimizer state"] - split.parts["optimizer state"] == 2 * expert_bytes * 7 // 8
    assert "2 row(s)" in replicated.layout and "2 row(s)" in split.layout  # expert parallelism is data parallel too


def test_a_rollout_replica_holds_every_expert_and_its_routed_activations():
    engine = EngineConfig(num_slots=2, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                          prefill_buckets=(8,), attention_impl="window")
    plan = plan_rollout(MODEL, engine, HARDWARE, dtype="float32")
    assert plan.parts["weights"] == MODEL.num_params * 4


@pytest.mark.skipif(jax.local_device_count() < 8, reason="needs 8 devices (tests/conftest.py)")
@pytest.mark.parametrize("expert_parallel, tensor_parallel", [(8, 1), (4, 2)])
def test_the_plan_counts_the_weights_and_kv_pool_an_expert_parallel_engine_places(expert_parallel, tensor_parallel):
    from rlax_core.inference.engine import Engine
    from rlax_core.models.transformer import init_params

    engine_config = EngineConfig(num_slots=2, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                                 prefill_buckets=(8,), attention_impl="window", expert_parallel=expert_parallel,
                                 tensor_parallel=tensor_parallel)
    engine = Engine(engine_config, MODEL, init_params(MODEL, jax.random.key(0)))
    device = engine.devices[0]
    plan = plan_rollout(MODEL, engine_config, HARDWARE, dtype="float32")
    assert plan.parts["weights"] == bytes_on(device, jax.tree.leaves(engine.params))
    assert plan.parts["KV pool"] == bytes_on(device, (*engine.cache.k, *engine.cache.v))
    # Only the experts are divided over the expert axis: the rest is what tensor_parallel alone leaves.
    unsplit = plan_rollout(MODEL, dataclasses.replace(engine_config, expert_parallel=1), HARDWARE, dtype="float32")
    expert_bytes = 2 * 3 * 8 * MODEL.hidden_size * 64 * 4 // tensor_parallel  # 2 layers x gate/up/down x 8 experts
    assert unsplit.parts["weights"] - plan.parts["weights"] == expert_bytes * (expert_parallel - 1) // expert_parallel
    assert f"1 replica(s) x tensor_parallel {tensor_parallel} x expert_parallel {expert_parallel}" == plan.layout


def test_the_planner_refuses_expert_parallelism_the_model_or_host_cannot_take():
    dense = dataclasses.replace(MODEL, moe=None, architecture="llama")
    with pytest.raises(ConfigError, match="expert_parallel=2: the model is dense"):
        plan_rollout(dense, EngineConfig(expert_parallel=2), HARDWARE, dtype="float32")
    with pytest.raises(ConfigError, match="expert_parallel=16 does not divide the model's 8 experts"):
        plan_rollout(MODEL, EngineConfig(expert_parallel=16), SliceSpec(chip="cpu", chips_per_host=16, memory_gib=1),
                     dtype="float32")
    with pytest.raises(ConfigError, match="tensor_parallel 2 x expert_parallel 8 = 16 does not divide"):
        plan_rollout(MODEL, EngineConfig(expert_parallel=8, tensor_parallel=2), HARDWARE, dtype="float32")


def test_the_planner_warns_where_an_experts_units_split_into_partial_128_lane_tiles():
    from rlax_core.planning.tiles import expert_tile_warning

    qwen3_30b = dataclasses.replace(MODEL, moe=dataclasses.replace(MODEL.moe, expert_intermediate_size=768))
    warning = expert_tile_warning(qwen3_30b, "rollout", "v6e", 4, "engine.tensor_parallel")
    assert "192 per v6e chip" in warning and "engine.tensor_parallel in [1, 2, 3, 6]" in warning
    assert expert_tile_warning(qwen3_30b, "rollout", "v6e", 2, "engine.tensor_parallel") is None  # 384 units
    assert expert_tile_warning(qwen3_30b, "rollout", "h100", 4, "engine.tensor_parallel") is None  # no lane tiles
    assert expert_tile_warning(MODEL, "trainer", "v5p", 1, "trainer.mesh.tensor") is None  # nothing split
    narrow = expert_tile_warning(MODEL, "trainer", "v5p", 2, "trainer.mesh.tensor")  # 64 units: no whole tile at all
    assert "32 per v5p chip" in narrow and "split experts instead" in narrow


def test_rlax_plan_prints_the_tile_warning_for_the_30b_recipe_at_tensor_parallel_4(capsys):
    import argparse

    from pipelines.plan import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)  # every flag rlax plan has, at its default
    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "qwen3_30b_a3b_math_tpu.yaml")
    args = argparse.Namespace(**{**vars(parser.parse_args([])), "config": recipe,
                                 "overrides": ["engine.tensor_parallel=4", "engine.expert_parallel=2"]})
    run(args, [])
    assert "warning: rollout: each expert's 768 units over engine.tensor_parallel=4 are 192 per v6e chip" in \
        capsys.readouterr().err
    run(argparse.Namespace(**{**vars(args), "overrides": []}), [])
    assert "warning" not in capsys.readouterr().err  # the recipe as shipped: 384 units per chip
