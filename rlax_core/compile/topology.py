"""Accelerators without the accelerator: the devices of a role's chips, to compile programs for.

    devices = slice_devices("v5e", chips=4, chips_per_host=4)     # the 4 chips of a v5e 2x2 host
    devices = slice_devices("h100", chips=8, chips_per_host=8)    # one 8 x H100 host (``compile.gpu``)

TPU slices come from libtpu's own description; GPUs from XLA's target description of the chip
(``rlax_core.compile.gpu``). A chip that is neither gets one line that says so.

``jax.experimental.topologies.get_topology_desc`` describes a slice to the TPU compiler on any host
with libtpu installed (the lock-tpu environment); programs lowered with shardings over its devices
compile for that slice. A role's chips map to the slice shape Cloud TPU sells for that count: v5e and
v6e are 2-D (a host holds 2x2 or 2x4 chips), v4 and v5p 3-D (a host holds 2x2x1).
"""

from __future__ import annotations

import functools
import math
import os

from rlax_core.compile import gpu
from rlax_core.config import ConfigError
from rlax_core.planning.hardware import TPU_CHIPS, platform_of

# Host shapes (chips per host) Cloud TPU sells, per chip and chips per host.
_HOST_BOUNDS = {("v5e", 1): (1, 1, 1), ("v5e", 4): (2, 2, 1), ("v5e", 8): (2, 4, 1),
                ("v6e", 1): (1, 1, 1), ("v6e", 4): (2, 2, 1), ("v6e", 8): (2, 4, 1),
                ("v4", 4): (2, 2, 1), ("v5p", 4): (2, 2, 1)}


def _grid(chips: int, dims: int) -> tuple[int, ...]:
    """The most cube-like power-of-two grid of ``chips``: 2x2x1, 2x2x4, 4x8x8; 2x4, 8x16."""
    if chips < 1 or chips & (chips - 1):
        raise ConfigError("hardware", f"{chips} TPU chips: a slice holds a power of two of them")
    exponents = [0] * dims
    for i in range(int(math.log2(chips))):
        exponents[i % dims] += 1
    grid = sorted(2 ** e for e in exponents)
    # A 3-D slice of one host is 2x2x1 (x and y fill before z); larger ones grow smallest axis first.
    return tuple(grid[1:] + grid[:1]) if dims == 3 and chips <= 4 else tuple(grid)


def compiled_ahead(chip: str) -> bool:
    """Whether ``rlax compile`` compiles for ``chip`` ahead of time: TPU slices and NVIDIA GPUs do; a
    CPU device compiles its programs as it starts."""
    return chip in TPU_CHIPS or platform_of(chip) == "gpu"


def not_compiled_ahead(chip: str) -> str:
    """Why a role on ``chip`` is not compiled ahead of time, in one line."""
    return (f"rlax compile compiles for TPU slices ({', '.join(TPU_CHIPS)}) and NVIDIA GPUs "
            f"({', '.join(gpu.GPU_TARGETS)}); a {chip} role compiles as it starts, on its own devices")


def _unsupported(chip: str) -> ConfigError:
    return ConfigError("hardware", f"chip {chip!r}: {not_compiled_ahead(chip)}")


def topology_name(chip: str, chips: int, chips_per_host: int | None = None) -> str:
    """The slice's name: ``v5e:2x2`` and ``v5p:2x2x4`` as ``get_topology_desc`` takes them; for GPUs
    ``h100:1x1x8`` (slices x hosts x GPUs per host; ``chips_per_host`` defaults to all on one host)."""
    if not compiled_ahead(chip):
        raise _unsupported(chip)
    if platform_of(chip) == "gpu":
        return gpu.topology_name(chip, chips, chips_per_host or chips)
    return f"{chip}:{'x'.join(map(str, _grid(chips, 3 if chip in ('v4', 'v5p') else 2)))}"


def host_bounds(chip: str, chips_per_host: int) -> tuple[int, int, int]:
    try:
        return _HOST_BOUNDS[chip, chips_per_host]
    except KeyError:
        sold = sorted(n for c, n in _HOST_BOUNDS if c == chip)
        raise ConfigError("hardware", f"a {chip} host holds {' or '.join(map(str, sold))} chips, "
                                      f"not {chips_per_host}") from None


@functools.cache
def slice_devices(chip: str, chips: int, chips_per_host: int) -> tuple:
    """The devices of a ``chips``-chip slice of ``chip``, to lower and compile programs for."""
    from jax.experimental import topologies

    if not compiled_ahead(chip):
        raise _unsupported(chip)
    if platform_of(chip) == "gpu":
        return gpu.gpu_devices(chip, chips, chips_per_host)

    # libtpu looks for the TPU VM's metadata when it loads; there is none on a compile-only host.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{chip}-{chips}")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # libtpu takes a host-wide lockfile that guards a TPU's chips; a compiling process opens none, and
    # without this a second one on the host (CI beside an engineer's run) fails to load libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    name = topology_name(chip, chips)
    try:
        topology = topologies.get_topology_desc(platform="tpu", topology_name=name,
                                                chips_per_host_bounds=host_bounds(chip, min(chips, chips_per_host)),
                                                num_slices=1)
    except Exception as error:  # noqa: BLE001 - libtpu's errors are RuntimeError, XlaRuntimeError, ...
        raise ConfigError("hardware", f"no TPU compiler for {name}: {' '.join(str(error).split())[:300]} "
                                      "(the TPU compiler is libtpu: run in the lock-tpu environment, "
                                      "`make setup-tpu-compile`)") from None
    return tuple(topology.devices)
