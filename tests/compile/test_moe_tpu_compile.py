"""A mixture of experts compiled for TPU by libtpu on this host (the TPU lane): its grouped products
lower to XLA's TPU ragged-dot kernel, and expert parallelism over a v5e 2x2 slice to an all-gather and a
reduce-scatter around it, in the trainer's gradient and in an expert-parallel engine's programs (a small
Qwen3-MoE recipe's rollout, compiled by ``rlax compile``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.tpu


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_a_sparse_models_training_gradient_compiles_to_ragged_dot_kernels(expert_parallel):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from rlax_core.compile.topology import slice_devices
    from rlax_core.models.config import MoeConfig, toy_moe_config
    from rlax_core.models.transformer import forward, init_params, param_logical_axes
    from rlax_core.parallel import BATCH_AXES, MeshConfig, make_mesh, tree_shardings

    config = toy_moe_config(moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=128),
                            num_layers=2, hidden_size=256, num_heads=4, head_dim=64)
    devices = slice_devices("v5e", 4, 4)
    mesh = make_mesh(MeshConfig(fsdp=1, expert=4) if expert_parallel else MeshConfig(fsdp=1), devices[:4 if expert_parallel else 1])
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    params = jax.tree.map(lambda sharding, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                          tree_shardings(shapes, param_logical_axes(config), mesh), shapes)
    tokens = jax.ShapeDtypeStruct((8, 128), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec(BATCH_AXES, None)))
    loss = lambda p, ids: jnp.mean(forward(p, config, ids, mesh=mesh if expert_parallel else None))  # noqa: E731
    text = jax.jit(jax.grad(loss)).lower(params, tokens).compile().as_text()
    assert "ragged_dot" in text and "tpu_custom_call" in text
    assert ("all-gather" in text and "reduce-scatter" in text) == expert_parallel
    assert re.search(r"ragged-dot", text)


REPO = Path(__file__).resolve().parents[2]
SPARSE_RECIPE = "tests/fixtures/compile/small_qwen3_moe_tpu.yaml"


def test_a_sparse_recipes_expert_parallel_rollout_compiles_to_ragged_dot_kernels(tmp_path):
    """``rlax compile`` of a Qwen3-MoE recipe's rollout, its engine tensor_parallel 2 x expert_parallel 2
    over v5e 2x2: prefill and decode each run their experts as the ragged-dot kernels beside the
    attention kernel, and hold the weights and KV pool the planner counts per chip."""
    from pipelines.config import load_run_config, template_of
    from rlax_core.models.checkpoint import read_model_config
    from rlax_core.planning.memory import plan_rollout
    from tests.support.rlax_compile import run_compile

    report = run_compile(tmp_path, SPARSE_RECIPE, ["--roles", "rollout"])
    programs = {p["program"]: p for p in report["programs"]}
    assert sorted(programs) == ["decode 8 slots x 16 steps (tpu)", "prefill 4x128"]
    assert all(p["compiled"] and p["topology"] == "v5e:2x2" for p in programs.values())
    for name, attention in (("prefill 4x128", "splash_mqa_fwd"), ("decode 8 slots x 16 steps (tpu)", "paged_attention")):
        kernels = programs[name]["kernels"]
        assert [k for k in kernels if k.startswith("ragged-dot")] and [k for k in kernels if k.startswith(attention)], \
            (name, kernels)
    config = load_run_config(REPO / SPARSE_RECIPE)
    plan = plan_rollout(read_model_config(template_of(config.model.resolved_path())), config.engine,
                        config.hardware.rollout, config.model.dtype)
    held = plan.parts["weights"] + plan.parts["KV pool"]  # a quarter of the experts, half of the rest and the pool
    assert held < programs["decode 8 slots x 16 steps (tpu)"]["argument_bytes"] < 1.05 * held + 64 * 1024
    ratio = report["roles"]["rollout"]["planned_bytes_per_chip"] / report["roles"]["rollout"]["xla_bytes_per_chip"]
    assert 1.0 <= ratio <= 1.25, ratio


def test_the_expert_parallel_decode_gathers_tokens_to_their_experts_and_scatters_the_outputs_back():
    from pipelines.config import load_run_config, template_of
    from rlax_core.compile.programs import engine_programs
    from rlax_core.compile.topology import slice_devices
    from rlax_core.inference.sampling import SamplingMode
    from rlax_core.models.checkpoint import read_model_config

    config = load_run_config(REPO / SPARSE_RECIPE)
    model = read_model_config(template_of(config.model.resolved_path()))
    (decode,) = [program for program in engine_programs(model, config.engine, config.model.dtype,
                                                        slice_devices("v5e", 4, 4), SamplingMode.TEMPERATURE)
                 if program.name.startswith("decode")]
    lowered = decode.lower()
    # models.moe.expert_parallel's dispatch, as the engine writes it: the slots' tokens gathered over the
    # expert axis, the outputs reduce-scattered back. libtpu keeps the gather; at 8 slots it turns the
    # reduce-scatter into an all-reduce.
    assert "stablehlo.all_gather" in lowered.as_text() and "stablehlo.reduce_scatter" in lowered.as_text()
    text = lowered.compile().as_text()
    assert "all-gather" in text and "ragged-dot" in text
