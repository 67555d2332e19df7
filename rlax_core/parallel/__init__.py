"""The device mesh and its logical-axis rules, shared by the trainer and the engine.

    from rlax_core.parallel import MeshConfig, make_mesh, tree_shardings

``config`` holds ``MeshConfig`` (``data x fsdp x expert x tensor``, multi-host settings); ``mesh`` builds the
mesh, maps logical axis names to mesh axes (``PARTITION_RULES``) and joins a multi-host job. It sits
below ``training`` and ``inference`` so that neither imports the other to place an array.
"""

from rlax_core.utils.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ["MeshConfig"],
    "mesh": [
        "BATCH_AXES", "MESH_AXES", "PARTITION_RULES", "batch_sharding", "initialize_distributed", "make_mesh",
        "mesh_shape", "replicated", "spec_for", "tree_shardings",
    ],
})
