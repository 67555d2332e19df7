"""NVIDIA GPUs without a GPU: the devices of a recipe's GPUs, from XLA's description of the chip.

    devices = gpu_devices("h100", chips=8, chips_per_host=8)       # one 8 x H100 host

JAX compiles for a GPU it only has a description of: ``get_topology_desc(platform="cuda",
target_config=<a GpuTargetConfigProto in text form>, topology="<slices>x<hosts>x<gpus per host>")``
gives compile-only devices (jax's ``tests/aot_test.py::test_deviceless_aot_compile``), on a host with
jax's CUDA plugin, ptxas and cuDNN installed (the lock-gpu environment, ``make setup-gpu-compile``).

The descriptions are XLA's own target specs (``xla/backends/gpu/target_config/specs/``), vendored in
``gpu_targets/`` with their licence notice, the XLA commit they come from and what was changed; XLA
has none for the L4, whose file is derived from XLA's RTX A6000 spec with the L4's published figures
(its header names them). ``GPU_TARGETS`` maps the recipes' chip names to them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

from rlax_core.config import ConfigError

TARGETS_DIR = Path(__file__).with_name("gpu_targets")


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    file: str  # under gpu_targets/
    source: str  # where its figures come from


_XLA_SPECS = "XLA's target spec xla/backends/gpu/target_config/specs/"
GPU_TARGETS: dict[str, GpuTarget] = {
    "a100-40gb": GpuTarget("a100_sxm_40.txtpb", _XLA_SPECS + "a100_sxm_40.txtpb @ openxla/xla 4336d12e"),
    "a100-80gb": GpuTarget("a100_sxm_80.txtpb", _XLA_SPECS + "a100_sxm_80.txtpb @ openxla/xla 4336d12e"),
    "h100": GpuTarget("h100_sxm.txtpb", _XLA_SPECS + "h100_sxm.txtpb @ openxla/xla 0774019d"),
    "h200": GpuTarget("h200.txtpb", _XLA_SPECS + "h200.txtpb @ openxla/xla 4336d12e"),
    "l4": GpuTarget("l4.txtpb", "derived: XLA's a6000.txtpb @ openxla/xla 4336d12e with the L4's published "
                                "figures (NVIDIA L4 datasheet; CUDA compute capability 8.9)"),
}

_DNN_VERSION = re.compile(r"^dnn_version_info \{.*?^\}\n", re.MULTILINE | re.DOTALL)


def _installed_cudnn() -> tuple[int, int, int] | None:
    """The cuDNN this environment (the worker image's packages) loads, or None without one."""
    try:
        from jax._src.lib import cuda_versions
        version = cuda_versions.cudnn_get_version() if cuda_versions is not None else None
    except Exception:  # noqa: BLE001 - no cuDNN library, or a jaxlib without the CUDA plugin
        return None
    if not version:
        return None
    return version // 10000, version // 100 % 100, version % 100  # 9.28.0 is 92800


def target_config(chip: str) -> str:
    """The GpuTargetConfigProto text of ``chip``, its cuDNN version that of this environment.

    XLA picks cuDNN features by the version the target names; the programs run with the worker
    image's cuDNN (the lock's), not with the one XLA's spec was captured beside, so that is the one named.
    """
    if chip not in GPU_TARGETS:
        raise ConfigError("hardware", f"no GPU target description for {chip!r}; rlax compile knows "
                                      f"{', '.join(GPU_TARGETS)} (rlax_core/compile/gpu_targets/)")
    text = (TARGETS_DIR / GPU_TARGETS[chip].file).read_text()
    cudnn = _installed_cudnn()
    if cudnn is not None:
        major, minor, patch = cudnn
        text = _DNN_VERSION.sub(f"dnn_version_info {{\n  major: {major}\n  minor: {minor}\n  patch: {patch}\n}}\n", text)
    return text


def gpu_topology(chips: int, chips_per_host: int) -> str:
    """``get_topology_desc``'s topology for ``chips`` GPUs, ``chips_per_host`` to a host: ``1x<hosts>x<per host>``."""
    if chips < 1 or chips_per_host < 1 or chips % chips_per_host:
        raise ConfigError("hardware", f"{chips} GPUs on hosts of {chips_per_host}: a GPU slice is whole hosts")
    return f"1x{chips // chips_per_host}x{chips_per_host}"


def topology_name(chip: str, chips: int, chips_per_host: int) -> str:
    """The report's name for the GPUs: ``h100:1x1x8`` (slices x hosts x GPUs per host)."""
    return f"{chip}:{gpu_topology(chips, chips_per_host)}"


@functools.cache
def gpu_devices(chip: str, chips: int, chips_per_host: int) -> tuple:
    """Compile-only devices of ``chips`` ``chip`` GPUs, ``chips_per_host`` to a host."""
    import jax
    from jax.experimental import topologies

    # On a host without a GPU, jax's CUDA plugin refuses to start a client ("Unable to load CUDA")
    # and its topology factory goes with it. Compile-only devices need no client: JAX runs on the
    # CPU, as jax's own deviceless test does (a GPU host compiles the same way).
    jax.config.update("jax_platforms", "cpu")
    config, topology = target_config(chip), gpu_topology(chips, chips_per_host)
    try:
        description = topologies.get_topology_desc(platform="cuda", target_config=config, topology=topology)
    except Exception as error:  # noqa: BLE001 - jax raises RuntimeError, JaxRuntimeError, NotImplementedError
        raise ConfigError("hardware", f"no GPU compiler for {chip}:{topology}: {' '.join(str(error).split())[:300]} "
                                      "(the GPU compiler is jax's CUDA plugin with ptxas and cuDNN: run in the "
                                      "lock-gpu environment, `make setup-gpu-compile`)") from None
    return tuple(description.devices)
