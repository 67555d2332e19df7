"""Compile a role's programs and read back what XLA says about them: bytes per chip, FLOPs, time.

    reports = [compile_program(program, chip="v5e", topology="v5e:2x2") for program in programs]
    print(format_table(reports))

Per program: whether it compiled (else the compiler's error, one line); ``memory_analysis()``'s
bytes per chip (arguments, outputs, temporaries, generated code; the donated buffers that outputs
alias are counted once); ``cost_analysis()``'s FLOPs, bytes accessed and XLA's own
``optimal_seconds``; the roofline time ``max(flops / peak FLOP/s, bytes / HBM bandwidth)`` from the
chip's published peaks (``planning.hardware.CHIP_PEAKS``); and the Pallas kernels lowered through
Mosaic (``tpu_custom_call``s in the compiled HLO, which Pallas names after the kernel).
A kernel lowered in interpret mode, or a jnp fallback, leaves no such call: the CI lane checks for it.

FLOPs and bytes are XLA's count for one chip's program. For programs with loops (the trainer's scan
over micro-batches, the decode loop) XLA counts a loop body once, so its totals are per iteration.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from rlax_core.compile.programs import Program
from rlax_core.planning.hardware import CHIP_PEAKS
from rlax_core.planning.memory import gib

# Pallas names a kernel's custom call after the kernel: "%paged_attention.3 = ... tpu_custom_call".
_MOSAIC_CALL = re.compile(r'^\s*(?:ROOT )?%([\w\-]+?)(?:\.\d+)* = .*custom_call_target="tpu_custom_call"', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    role: str
    program: str
    chip: str
    topology: str
    compiled: bool
    error: str = ""
    compile_s: float = 0.0
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0  # outputs that reuse donated arguments (the KV cache, the train state)
    temp_bytes: int = 0
    code_bytes: int = 0
    flops: float = 0.0
    bytes_accessed: float = 0.0
    optimal_s: float | None = None  # XLA's own estimate; None where it gives none (or a negative one)
    roofline_s: float | None = None
    pallas_kernels: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        """Bytes the program holds on one chip while it runs."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes}


def mosaic_kernels(hlo_text: str) -> tuple[str, ...]:
    """The Pallas kernels compiled through Mosaic in an optimised HLO module, by name, each once."""
    return tuple(dict.fromkeys(_MOSAIC_CALL.findall(hlo_text)))


def roofline_seconds(chip: str, flops: float, bytes_accessed: float) -> float | None:
    peak = CHIP_PEAKS.get(chip)
    if peak is None:
        return None
    return max(flops / peak.bf16_flops, bytes_accessed / peak.hbm_bytes_per_s)


def compile_program(program: Program, chip: str, topology: str) -> ProgramReport:
    """Lower and compile ``program``; a compiler error becomes the report's ``error``, not an exception."""
    started = time.monotonic()
    try:
        compiled = program.lower().compile()
    except Exception as error:  # noqa: BLE001 - the compiler's error is the finding
        message = " ".join(str(error).split())
        return ProgramReport(program.role, program.name, chip, topology, compiled=False,
                             error=f"{type(error).__name__}: {message[:500]}", compile_s=time.monotonic() - started)
    elapsed = time.monotonic() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX: one dict per partition
        cost = cost[0] if cost else {}
    flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    optimal = cost.get("optimal_seconds")
    return ProgramReport(
        program.role, program.name, chip, topology, compiled=True, compile_s=elapsed,
        argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
        code_bytes=memory.generated_code_size_in_bytes, flops=flops, bytes_accessed=accessed,
        optimal_s=float(optimal) if optimal is not None and optimal >= 0 else None,
        roofline_s=roofline_seconds(chip, flops, accessed), pallas_kernels=mosaic_kernels(compiled.as_text()))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def format_table(reports: list[ProgramReport], hbm_bytes: dict[str, int], planned: dict[str, int]) -> str:
    """A Markdown table: one row per program; ``hbm_bytes`` and ``planned`` per role (bytes per chip)."""
    lines = ["| role | program | topology | compiled | XLA bytes per chip (args + out + temp + code) | planner | HBM "
             "| GFLOP | GB accessed | XLA optimal | roofline | Pallas (Mosaic) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        if not r.compiled:
            lines.append(f"| {r.role} | {r.program} | {r.topology} | error: {r.error} | | | | | | | | |")
            continue
        parts = f"{gib(r.peak_bytes)} ({gib(r.argument_bytes)} + {gib(r.output_bytes - r.alias_bytes)} + " \
                f"{gib(r.temp_bytes)} + {gib(r.code_bytes)})"
        plan = gib(planned[r.role]) if r.role in planned else "-"
        hbm = gib(hbm_bytes[r.role]) if r.role in hbm_bytes else "-"
        lines.append(f"| {r.role} | {r.program} | {r.topology} | yes ({r.compile_s:.0f} s) | {parts} | {plan} | {hbm} | "
                     f"{r.flops / 1e9:.4g} | {r.bytes_accessed / 1e9:.4g} | {_seconds(r.optimal_s)} | "
                     f"{_seconds(r.roofline_s)} | {', '.join(r.pallas_kernels) or '-'} |")
    return "\n".join(lines)
