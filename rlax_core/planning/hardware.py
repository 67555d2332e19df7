"""Declared hardware: which chips a run's rollout fleet and trainer get, and how much memory each has.

    hardware:
      rollout: {chip: v5e, chips_per_host: 4, hosts: 16}     # 16 Dataflow workers of a 2x2 v5e slice
      trainer: {chip: v5p, chips_per_host: 4, hosts: 4}      # a 16-chip v5p slice

``chip`` names a row of ``CHIP_MEMORY_GIB`` (the accelerator's HBM per chip as published by its
vendor) or is ``cpu``, whose memory per device must be given as ``memory_gib`` (a CPU device is a
core sharing the host's RAM: give that RAM divided by the devices the host runs). ``memory_gib``
also overrides a table entry (a chip variant, a share of a chip).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from rlax_core.config import require

GIB = 1024 ** 3

# HBM per chip, GiB.
CHIP_MEMORY_GIB: dict[str, float] = {
    "v4": 32.0,
    "v5e": 16.0,
    "v5p": 95.0,
    "v6e": 32.0,
    "a100-40gb": 40.0,
    "a100-80gb": 80.0,
    "h100": 80.0,
    "h200": 141.0,
    "l4": 24.0,
}
CPU = "cpu"


@dataclasses.dataclass(frozen=True)
class ChipPeak:
    """A chip's published peak dense bfloat16 compute and HBM bandwidth, for roofline times."""

    bf16_flops: float  # FLOP/s
    hbm_bytes_per_s: float
    source: str  # where the figures are published


_TPU_DOCS = "https://cloud.google.com/tpu/docs/"
# Peak dense bfloat16 FLOP/s and HBM bandwidth per chip, as their vendors publish them (no sparsity).
CHIP_PEAKS: dict[str, ChipPeak] = {
    "v4": ChipPeak(275e12, 1228e9, _TPU_DOCS + "v4"),
    "v5e": ChipPeak(197e12, 819e9, _TPU_DOCS + "v5e"),
    "v5p": ChipPeak(459e12, 2765e9, _TPU_DOCS + "v5p"),
    "v6e": ChipPeak(918e12, 1640e9, _TPU_DOCS + "v6e"),
    "a100-40gb": ChipPeak(312e12, 1555e9, "https://www.nvidia.com/en-us/data-center/a100/"),
    "a100-80gb": ChipPeak(312e12, 2039e9, "https://www.nvidia.com/en-us/data-center/a100/"),
    "h100": ChipPeak(989e12, 3350e9, "https://www.nvidia.com/en-us/data-center/h100/ (SXM)"),
    "h200": ChipPeak(989e12, 4800e9, "https://www.nvidia.com/en-us/data-center/h200/ (SXM)"),
    "l4": ChipPeak(121e12, 300e9, "https://www.nvidia.com/en-us/data-center/l4/"),
}
TPU_CHIPS = ("v4", "v5e", "v5p", "v6e")  # the chips JAX compiles for ahead of time with libtpu


# The chip of a device, from the kind JAX reports (``jax.Device.device_kind``), in table order: the
# first pattern that matches names it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "TPU v5 lite").
_DEVICE_KINDS = (("h200", r"\bH200\b"), ("h100", r"\bH100\b"), ("a100-80gb", r"\bA100\b.*80GB"),
                 ("a100-40gb", r"\bA100\b"), ("l4", r"\bL4\b"), ("v5e", r"^TPU v5 ?lite"), ("v5p", r"^TPU v5p?$"),
                 ("v6e", r"^TPU v6 ?lite"), ("v4", r"^TPU v4"))


def chip_of_device_kind(kind: str) -> Optional[str]:
    """The table's chip for a device kind JAX reports, or None (a CPU, or a chip the table lacks: the
    table's GPUs are the SXM parts and the L4, so a PCIe card, of other peaks, is not one of them)."""
    import re

    if "PCIe" in kind:
        return None
    return next((chip for chip, pattern in _DEVICE_KINDS if re.search(pattern, kind)), None)


def platform_of(chip: str) -> str:
    """JAX's platform name for a chip of the table: tpu, gpu or cpu."""
    return "tpu" if chip in TPU_CHIPS else CPU if chip == CPU else "gpu"


@dataclasses.dataclass(frozen=True)
class SliceSpec:
    """One role's chips: ``hosts`` machines of ``chips_per_host`` chips of one kind."""

    chip: str = CPU
    chips_per_host: int = 1
    hosts: int = 1
    memory_gib: Optional[float] = None  # per chip; required for cpu, overrides the table otherwise

    def __post_init__(self):
        known = sorted(CHIP_MEMORY_GIB) + [CPU]
        require(self.chip in known, "chip", f"unknown chip {self.chip!r}; known: {', '.join(known)}")
        require(self.chips_per_host >= 1, "chips_per_host", "must be at least 1")
        require(self.hosts >= 1, "hosts", "must be at least 1")
        require(self.memory_gib is None or self.memory_gib > 0, "memory_gib", "must be > 0")
        require(self.chip != CPU or self.memory_gib is not None, "memory_gib",
                "a cpu slice needs memory_gib: the RAM each device (core) may use")

    @property
    def chips(self) -> int:
        return self.chips_per_host * self.hosts

    @property
    def bytes_per_chip(self) -> int:
        gib = self.memory_gib if self.memory_gib is not None else CHIP_MEMORY_GIB[self.chip]
        return int(gib * GIB)


@dataclasses.dataclass(frozen=True)
class HardwareConfig:
    """The run's declared hardware, per role; the memory planner checks the config against it."""

    rollout: Optional[SliceSpec] = None
    trainer: Optional[SliceSpec] = None
    # Difficulty filtering's and evaluation's workers; by default the rollout fleet's kind of worker.
    # A filter or evaluate recipe of its own declares only these.
    filter: Optional[SliceSpec] = None
    evaluate: Optional[SliceSpec] = None
    # A reward model's own scoring stage (rewards.reward_model.placement: own_stage); by default the
    # rollout fleet's kind of worker.
    reward_model: Optional[SliceSpec] = None

    def __post_init__(self):
        require(any((self.rollout, self.trainer, self.filter, self.evaluate)), "",
                "declare the chips of at least one role: rollout, trainer, filter or evaluate")

    def workers_of(self, role: str) -> Optional[SliceSpec]:
        """The chips ``role`` runs on (filter and evaluate: their own, else the rollout fleet's)."""
        own = getattr(self, role)
        return own if own is not None or role in ("rollout", "trainer") else self.rollout
