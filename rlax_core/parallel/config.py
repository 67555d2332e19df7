"""``MeshConfig``: the shape of the device mesh, and how a process joins a multi-host job.

The trainer reads it under ``trainer.mesh``; the engine builds a tensor-only one per replica.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlax_core.config import require


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh: ``data x fsdp x expert x context x tensor``; -1 on one axis takes the devices left over.

    ``expert`` splits a mixture of experts' experts (and, like ``data``, the batch); a dense model
    treats it as more data parallelism.

    Multi-host: set ``coordinator_address`` (``host:port`` of process 0), ``num_processes`` and
    ``process_id`` and every process calls ``jax.distributed.initialize`` with them before the mesh
    is built. On TPU VMs / Cloud the three may be left unset and ``distributed: true`` lets JAX
    discover them.
    """

    data: int = 1
    fsdp: int = -1
    expert: int = 1
    context: int = 1  # splits each row's tokens (context parallelism: models.context)
    tensor: int = 1
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.expert, self.context, self.tensor)
        require(all(s == -1 or s >= 1 for s in sizes), "fsdp", "mesh axis sizes must be >= 1 or -1")
        require(sum(s == -1 for s in sizes) <= 1, "fsdp", "at most one mesh axis may be -1")
        explicit = (self.coordinator_address, self.num_processes, self.process_id)
        require(all(v is None for v in explicit) or all(v is not None for v in explicit), "coordinator_address",
                "set coordinator_address, num_processes and process_id together (or none of them)")
        require(self.num_processes is None or self.num_processes >= 1, "num_processes", "must be >= 1")
        require(self.process_id is None or 0 <= self.process_id < (self.num_processes or 1), "process_id",
                "must lie in [0, num_processes)")
