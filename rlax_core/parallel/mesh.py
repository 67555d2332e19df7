"""The device mesh (``data x fsdp x expert x context x tensor``) and the rules that place parameters and batches on it.

Parameters carry *logical* axis names (``rlax_core.models.param_logical_axes``: ``"embed"``,
``"vocab"``, ``"heads"``, ...). ``PARTITION_RULES`` maps each name to a mesh axis; a dimension whose
size the mesh axis does not divide stays replicated instead of failing, so one rule set serves a toy
model on 8 simulated CPU devices and a 7B model on a TPU slice. Batches are split over ``data``,
``fsdp`` and ``expert`` together (FSDP is data parallelism whose parameters are sharded too; expert
parallelism is data parallelism whose experts are split too: a sparse layer's tokens travel to the
devices holding their experts, ``models.moe``). A dense model on ``expert`` > 1 is data parallel there.
``context`` splits each row's tokens (context parallelism, ``models.context``): parameters are
replicated over it, the batch is not split over it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax_core.parallel.config import MeshConfig

log = logging.getLogger(__name__)

# Tensor-parallel neighbours should be the closest devices, then the experts' all-gathers: the last
# mesh axes vary fastest.
MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")

# logical axis name -> mesh axis (or None: replicated). Names not listed are replicated.
PARTITION_RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",  # a dense MLP's hidden units, and each expert's
    "expert": "expert",  # the stacked experts of a sparse layer
    "router": None,  # the router's scores: every device scores every expert
    "head_dim": None,
    "layers": None,
    "norm": None,
}

_distributed_started = False


def initialize_distributed(config: MeshConfig) -> None:
    """Join the multi-host job (once per process) when the config asks for it; no-op otherwise."""
    global _distributed_started
    if _distributed_started or not (config.distributed or config.coordinator_address):
        return
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
        # Cross-process collectives of CPU devices need an implementation (older JAX had none by default).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if config.coordinator_address:
        jax.distributed.initialize(coordinator_address=config.coordinator_address,
                                   num_processes=config.num_processes, process_id=config.process_id)
    else:
        jax.distributed.initialize()
    _distributed_started = True
    log.info("joined distributed job: process %d of %d, %d global devices", jax.process_index(),
             jax.process_count(), jax.device_count())


def mesh_shape(config: MeshConfig, num_devices: int) -> tuple[int, int, int, int, int]:
    """The sizes of ``MESH_AXES`` (data, fsdp, expert, context, tensor) over ``num_devices``."""
    sizes = [config.data, config.fsdp, config.expert, config.context, config.tensor]
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if num_devices % known:
            raise ValueError(f"mesh {tuple(sizes)} does not fit {num_devices} devices")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh data x fsdp x expert x context x tensor = {tuple(sizes)} needs {math.prod(sizes)} devices, "
                         f"{num_devices} available")
    return tuple(sizes)


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``data x fsdp x expert x context x tensor`` mesh over ``devices`` (default: every device of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(config, len(devices))
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def spec_for(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
             rules: Mapping[str, Any] = PARTITION_RULES) -> PartitionSpec:
    """The PartitionSpec of one array; indivisible dimensions and reused mesh axes stay replicated."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            spec.append(axes[0] if len(axes) == 1 else axes)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def tree_shardings(shapes: Any, logical_axes: Any, mesh: Mesh,
                   rules: Mapping[str, Any] = PARTITION_RULES) -> Any:
    """NamedShardings for a tree of arrays (or ShapeDtypeStructs) given a matching tree of axis names."""
    return jax.tree.map(lambda axes, x: NamedSharding(mesh, spec_for(axes, x.shape, mesh, rules)),
                        logical_axes, shapes, is_leaf=lambda node: isinstance(node, tuple))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rows over ``data x fsdp x expert``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
