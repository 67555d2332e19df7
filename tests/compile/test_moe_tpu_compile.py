"""A mixture of experts compiled for TPU by libtpu on this host (the TPU lane): its grouped products
lower to XLA's TPU ragged-dot kernel, and expert parallelism over a v5e 2x2 slice to an all-gather and a
reduce-scatter around it."""

from __future__ import annotations

import re

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
