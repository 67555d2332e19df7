"""Layouts the TPU compiler pays for: an expert's units split into tiles narrower than a lane row.

A TPU vector register holds 8 x 128 values; XLA:TPU tiles an array's minor axis by 128 lanes. When a
mixture of experts' ``expert_intermediate_size`` split over the tensor axis is not a multiple of 128,
XLA keeps the expert kernels with their other (wide) axis minor and copies each layer's to the
grouped matmul's layout inside the decode loop. Measured on Qwen3-30B-A3B (docs/compile.md): at
``tensor_parallel 4`` (192 units per chip) the copies took 0.98x the experts' own bytes as temporaries
and the 48-layer decode did not fit a v6e chip; at ``tensor_parallel 2`` (384) there was no copy. The
memory planner cannot see the copy (it is XLA's choice of layout), so ``rlax plan`` warns instead.
"""

from __future__ import annotations

from rlax_core.models.config import ModelConfig
from rlax_core.planning.hardware import platform_of

LANES = 128


def expert_tile_warning(model: ModelConfig, role: str, chip: str, tensor: int, key: str) -> str | None:
    """One line when ``role``'s chips each hold an expert's units in a partial 128-lane tile; else None.

    ``tensor``: the ways the role splits each expert's units (the engine's ``tensor_parallel``, the
    trainer mesh's ``tensor`` axis); ``key``: the config key that sets it.
    """
    moe = model.moe
    if moe is None or platform_of(chip) != "tpu" or tensor <= 1:
        return None
    units = moe.expert_intermediate_size
    if units % tensor == 0 and (units // tensor) % LANES == 0:
        return None
    whole = [ways for ways in range(1, units + 1) if units % ways == 0 and (units // ways) % LANES == 0]
    suggestion = (f"{key} in {whole} keeps whole tiles" if whole else
                  f"no split of {units} units keeps whole tiles; split experts instead (expert parallelism)")
    return (f"{role}: each expert's {units} units over {key}={tensor} are {units / tensor:g} per {chip} chip, "
            f"not whole {LANES}-lane tiles: XLA:TPU copies every sparse layer's expert kernels to the grouped "
            f"matmul's layout (up to about the experts' own bytes again as temporaries, not in this plan; "
            f"docs/compile.md); {suggestion}")
