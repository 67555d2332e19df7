"""Planning a run against its hardware before it starts: ``hardware`` (declared chips and their
memory) and ``memory`` (bytes per chip of the rollout engine and the trainer; refusal with the numbers)."""

from rlax_core.planning.hardware import CHIP_MEMORY_GIB, HardwareConfig, SliceSpec
from rlax_core.planning.memory import MemoryPlan, plan_rollout, plan_trainer, refuse_unless_fits

__all__ = ["CHIP_MEMORY_GIB", "HardwareConfig", "MemoryPlan", "SliceSpec", "plan_rollout", "plan_trainer",
           "refuse_unless_fits"]
