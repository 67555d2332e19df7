"""A tensor- (and expert-) parallel engine replica: one model over several devices of a host.

    mesh = engine_mesh(devices, expert_parallel=2)    # data=1 x fsdp=1 x expert=2 x tensor=len(devices)/2
    params = jax.device_put(params, stacked_param_shardings(model_config, params, mesh))
    cache_sharding = kv_pool_sharding(pool_shape, mesh)

The placement is the trainer's: the same mesh axes and ``PARTITION_RULES``
(``rlax_core.parallel``) applied to the model's logical axis names
(``rlax_core.models.param_logical_axes``), so attention is split by heads (query heads and KV
heads), the MLP by its hidden columns (``down_proj`` by its rows) and the vocabulary by rows; norms
stay replicated. The paged KV cache is split by KV head: a device holds its heads' slice of every
page, so the attention of a head never leaves the device that computed its keys. A dimension the
mesh does not divide stays replicated, as in the trainer (a model with 2 KV heads on 8 devices
keeps whole K/V projections and a whole cache on every device: correct, but not 1/8 the memory;
the memory planner counts it so).

A mixture of experts with ``engine.expert_parallel`` E > 1 adds the mesh's ``expert`` axis: the
stacked experts of each sparse layer split E ways by the same rules (their logical ``expert`` axis),
everything else split over ``tensor`` only and so held whole by each of the E groups. The forward
runs the experts through the model's expert-parallel dispatch (``models.moe.expert_parallel``, the
trainer's): the programs pass the mesh to the model.

The compiled programs are the single-device ones: committed, sharded weights and cache make XLA's
SPMD partitioner insert the two all-reduces per layer (after ``o_proj`` and ``down_proj``) and the
all-gather of the logits' vocabulary shards. The Pallas kernels are not partitionable by XLA, so
the paged attention runs under ``shard_map`` over the KV-head axis (``programs``).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import adapter_logical_axes, quantized_logical_axes
from rlax_core.models.lora_config import LoraConfig
from rlax_core.models.transformer import param_logical_axes
from rlax_core.parallel import MeshConfig, make_mesh, spec_for, tree_shardings

TENSOR_AXIS = "tensor"
KV_POOL_AXES = ("kv_heads", None, None, "head_dim")  # [Hkv, num_pages, page_size, D]


def engine_mesh(devices: Sequence[jax.Device], expert_parallel: int = 1) -> Mesh:
    """An expert x tensor mesh over ``devices`` (the trainer's mesh type, data = fsdp = 1): the
    experts split ``expert_parallel`` ways, the rest over ``len(devices) / expert_parallel``."""
    return make_mesh(MeshConfig(data=1, fsdp=1, expert=expert_parallel, tensor=len(devices) // expert_parallel),
                     list(devices))


def check_expert_parallel(expert_parallel: int, model_config: ModelConfig) -> None:
    """``engine.expert_parallel`` > 1 needs a mixture of experts whose experts it divides."""
    if expert_parallel == 1:
        return
    if model_config.moe is None:
        raise ValueError(f"engine.expert_parallel={expert_parallel}: the model is dense (no experts to split); "
                         "set it to 1")
    if model_config.moe.num_experts % expert_parallel:
        raise ValueError(f"engine.expert_parallel={expert_parallel} does not divide the model's "
                         f"{model_config.moe.num_experts} experts")


def _is_axes(node) -> bool:
    return isinstance(node, tuple)


def held_logical_axes(model_config: ModelConfig, params: Any) -> dict:
    """``param_logical_axes`` for ``params`` as the engine holds them: with a scale beside each
    eight-bit kernel (``engine.weight_dtype``) when they are quantized."""
    axes = param_logical_axes(model_config)
    layer = params["layers"] if "layers" in params else params["layers_0"]
    quantized = any("kernel_scale" in projection for module in layer.values() if isinstance(module, dict)
                    for projection in module.values() if isinstance(projection, dict))
    return quantized_logical_axes(axes) if quantized else axes


def stacked_param_shardings(model_config: ModelConfig, params: Any, mesh: Mesh) -> Any:
    """Shardings of the trainer's parameter layout (stacked ``layers``) by the partition rules."""
    return tree_shardings(params, held_logical_axes(model_config, params), mesh)


def decoding_param_shardings(model_config: ModelConfig, params: Any, mesh: Mesh) -> Any:
    """Shardings of ``models.unstack_layers``' layout: each ``layers_i`` leaf as its stacked leaf
    without the leading ``layers`` axis."""
    return tree_shardings(params, _unstacked_axes(held_logical_axes(model_config, params), params), mesh)


def decoding_adapter_shardings(lora: LoraConfig, adapters: Any, mesh: Mesh) -> Any:
    """Shardings of ``lora.decoding_adapters(..., fuse=False)``: A split like its kernel's input axes,
    B like its output axes (so B's heads go where the kernel's do), the rank axis replicated."""
    return tree_shardings(adapters, _unstacked_axes(adapter_logical_axes(lora), adapters), mesh)


def _unstacked_axes(axes: dict, tree: Any) -> dict:
    axes = dict(axes)
    layer_axes = jax.tree.map(lambda names: names[1:], axes.pop("layers"), is_leaf=_is_axes)
    count = sum(name.startswith("layers_") for name in tree)
    axes.update({f"layers_{i}": layer_axes for i in range(count)})
    return axes


def kv_pool_sharding(pool_shape: Sequence[int], mesh: Mesh) -> NamedSharding:
    """One layer's K (or V) pool, or its scale pool [Hkv, num_pages, S], split by KV head where the
    mesh divides them."""
    return NamedSharding(mesh, spec_for(KV_POOL_AXES[:len(pool_shape)], pool_shape, mesh))


def kv_heads_split(num_kv_heads: int, mesh: Mesh) -> bool:
    """Whether the cache and the attention are split by KV head (the mesh divides the heads)."""
    return spec_for(KV_POOL_AXES, (num_kv_heads, 1, 1, 1), mesh)[0] is not None


def heads_spec(split: bool, ndim: int, axis: int) -> PartitionSpec:
    """A spec naming the tensor axis at ``axis`` of an ``ndim`` array, or replicated."""
    spec = [None] * ndim
    if split:
        spec[axis] = TENSOR_AXIS
    return PartitionSpec(*spec)
