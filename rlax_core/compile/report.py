"""Compile a role's programs and read back what XLA says about them: bytes per chip, FLOPs, time.

    reports = [compile_program(program, chip="v5e", topology="v5e:2x2") for program in programs]
    print(format_table(reports))

Per program: whether it compiled (else the compiler's error, one line); ``memory_analysis()``'s
bytes per chip (arguments, outputs, temporaries, generated code; the donated buffers that outputs
alias are counted once); XLA's FLOPs, bytes accessed and, on TPU, its own ``optimal_seconds``; the
roofline time ``max(flops / peak FLOP/s, bytes / HBM bandwidth)`` from the chip's published peaks
(``planning.hardware.CHIP_PEAKS``); and the kernels found in the compiled HLO (``kernels``): on TPU
the Pallas kernels lowered through Mosaic (``tpu_custom_call``s, which Pallas names after the
kernel), on GPU cuDNN's fused attention (``__cudnn$fmha...`` calls) and Pallas kernels lowered
through Triton (``__gpu$xla.gpu.triton`` calls, named in their backend config). A kernel lowered in
interpret mode, or a jnp fallback, leaves no such call: the CI lanes check for it.

FLOPs and bytes are XLA's count for one chip's program, in which a loop body counts once: for
programs with loops (the trainer's scans over epochs, micro-batches and layers, the windowed einsums
of sharded matmuls, the decode loop) XLA's totals are one trip of each loop. ``loop_factor``
(``compile.loops``) weighs each computation by its loops' trip counts, read from the compiled HLO:
``flops_per_run``, ``bytes_per_run`` and ``roofline_per_run_s`` are XLA's figures times it, what one
run of the program costs; ``unknown_loops`` names the loops without a known trip count (counted once).
On GPU, XLA's compile-only client gives no cost analysis; the figures are then XLA's ``HloCostAnalysis``
run over the optimised per-device module, which counts a custom call (cuDNN's attention, a Triton
kernel) as no FLOPs, and no optimal time is given.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any

from rlax_core.compile.decode_step import DECODE_PROGRAM, DecodeStepCost, decode_step_bytes, full_width_arrays
from rlax_core.compile.loops import loop_factor
from rlax_core.compile.programs import Program
from rlax_core.planning.hardware import CHIP_PEAKS, TPU_CHIPS
from rlax_core.planning.memory import gib

log = logging.getLogger(__name__)

# Pallas names a kernel's custom call after the kernel: "%paged_attention.3 = ... tpu_custom_call".
_MOSAIC_CALL = re.compile(r'^\s*(?:ROOT )?%([\w\-]+?)(?:\.\d+)* = .*custom_call_target="tpu_custom_call"', re.MULTILINE)
# cuDNN's fused attention: custom_call_target="__cudnn$fmhaScaleBiasSoftmax" (and ...Backward).
_CUDNN_CALL = re.compile(r'custom_call_target="__cudnn\$(fmha\w*)"')
# A Pallas kernel lowered through Triton: one line holds the call and, in its backend config, the
# kernel's name ("name = \"paged_attention_block_h_16_...\"").
_TRITON_CALL = re.compile(r'^.*custom_call_target="__gpu\$xla\.gpu\.triton".*$', re.MULTILINE)
_TRITON_NAME = re.compile(r'\bname = \\?"([\w\-]+)\\?"')


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
    kernels: tuple[str, ...] = ()  # see ``compiled_kernels``
    loop_factor: float = 1.0  # one run's FLOPs over XLA's (compile.loops): each loop at its trip count
    loops: int = 0  # while loops with a known trip count
    unknown_loops: tuple[str, ...] = ()  # while loops XLA gives no trip count for (counted once)
    full_width: tuple[str, ...] = ()  # buffers copying a held pool or weight whole (compile.decode_step)
    # A decode program's KV reads, which XLA does not see (compile.decode_step): bytes of one page of
    # a running sequence on one chip, and the running sequences and their mean context they are counted at.
    kv_bytes_per_page: float = 0.0
    page_size: int = 0
    # A TPU decode program's bytes as HBM sees them (``hbm_bytes_accessed``); None where not counted.
    hbm_bytes_accessed: float | None = None
    running_sequences: int = 0
    mean_context: float = 0.0

    @property
    def flops_per_run(self) -> float:
        return self.flops * self.loop_factor

    @property
    def bytes_per_run(self) -> float:
        return self.bytes_accessed * self.loop_factor

    @property
    def roofline_per_run_s(self) -> float | None:
        return None if self.roofline_s is None else self.roofline_s * self.loop_factor

    def step_cost(self) -> DecodeStepCost | None:
        """One decode step as a function of the running sequences (None: not a decode program, or no
        KV reads were counted for it)."""
        match = DECODE_PROGRAM.match(self.program)
        if not (self.compiled and match and self.page_size and self.chip in CHIP_PEAKS):
            return None
        return DecodeStepCost(self.chip, int(match.group(1)), self.flops, decode_step_bytes(vars(self)),
                              self.kv_bytes_per_page, self.page_size)

    def decode_step(self) -> dict[str, float] | None:
        """XLA's bytes, the KV pages read and their sum for one step of ``running_sequences`` at ``mean_context``."""
        cost = self.step_cost()
        if cost is None:
            return None
        contexts = [self.mean_context] * self.running_sequences
        return {"running_sequences": self.running_sequences, "mean_context": self.mean_context,
                "xla_bytes": cost.xla_bytes, "kv_read_bytes": cost.kv_read_bytes(contexts),
                "step_bytes": cost.bytes(contexts), "step_roofline_s": cost.seconds(contexts)}

    @property
    def peak_bytes(self) -> int:
        """Bytes the program holds on one chip while it runs."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes, "flops_per_run": self.flops_per_run,
                "bytes_per_run": self.bytes_per_run, "roofline_per_run_s": self.roofline_per_run_s,
                "decode_step": self.decode_step()}


def mosaic_kernels(hlo_text: str) -> tuple[str, ...]:
    """The Pallas kernels compiled through Mosaic in an optimised HLO module, by name, each once."""
    return tuple(dict.fromkeys(_MOSAIC_CALL.findall(hlo_text)))


def compiled_kernels(hlo_text: str) -> tuple[str, ...]:
    """The kernels of an optimised HLO module, by name, each once: Mosaic (TPU) Pallas kernels,
    ``cudnn:fmha...`` for cuDNN's fused attention, and Triton-lowered Pallas kernels (GPU)."""
    cudnn = [f"cudnn:{name}" for name in _CUDNN_CALL.findall(hlo_text)]
    triton = [m.group(1) for line in _TRITON_CALL.findall(hlo_text) if (m := _TRITON_NAME.search(line))]
    return tuple(dict.fromkeys([*mosaic_kernels(hlo_text), *cudnn, *triton]))


def xla_cost(compiled) -> dict[str, float]:
    """XLA's cost analysis of a compiled program: its own where the client gives one (TPU, CPU);
    else (a GPU's compile-only client) ``HloCostAnalysis`` over the optimised per-device module."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - "GetCostAnalysis is not supported" on some clients
        cost = None
    if isinstance(cost, list):  # older JAX: one dict per partition
        cost = cost[0] if cost else None
    if cost:
        return cost
    import jax
    from jax._src.lib import xla_client

    totals: dict[str, float] = {}
    try:
        analysis = xla_client._xla.hlo_module_cost_analysis  # jaxlib's binding of HloCostAnalysis
        for module in compiled.runtime_executable().hlo_modules():
            for key, value in analysis(jax.devices("cpu")[0].client, module).items():
                totals[key] = totals.get(key, 0.0) + value
    except Exception as error:  # noqa: BLE001 - a jaxlib without the binding
        log.warning("no cost analysis from XLA here (%s): the report's FLOPs and bytes are 0", error)
        return {}
    return totals


def roofline_seconds(chip: str, flops: float, bytes_accessed: float) -> float | None:
    peak = CHIP_PEAKS.get(chip)
    if peak is None:
        return None
    return max(flops / peak.bf16_flops, bytes_accessed / peak.hbm_bytes_per_s)


def compile_program(program: Program, chip: str, topology: str) -> ProgramReport:
    """Lower and compile ``program``; a compiler error becomes the report's ``error``, not an exception.
    A TPU decode program is compiled a second time for its HBM bytes (``hbm_bytes_accessed``)."""
    started = time.monotonic()
    try:
        lowered = program.lower()
        compiled = lowered.compile()
    except Exception as error:  # noqa: BLE001 - the compiler's error is the finding
        message = " ".join(str(error).split())
        return ProgramReport(program.role, program.name, chip, topology, compiled=False,
                             error=f"{type(error).__name__}: {message[:500]}", compile_s=time.monotonic() - started)
    report = report_compiled(program, chip, topology, compiled, time.monotonic() - started)
    if chip in TPU_CHIPS and DECODE_PROGRAM.match(program.name):
        report = dataclasses.replace(report, hbm_bytes_accessed=hbm_bytes_accessed(lowered),
                                     compile_s=time.monotonic() - started)
    return report


def hbm_bytes_accessed(lowered) -> float:
    """XLA:TPU's bytes accessed for ``lowered`` compiled with memory-space assignment off.

    XLA:TPU's count includes the traffic of its on-chip memory (VMEM): a weight that memory-space
    assignment prefetches there is counted as read from HBM, written to VMEM and read from VMEM by
    its product, up to three times its bytes (eight int8 MLP layers: 3.9x their weights, bfloat16
    ones 1.9x: int8 kernels fit VMEM more often, so the count punished them most). With the
    assignment off every buffer lives in HBM and each access counted is one of HBM: the weights are
    counted once (1.03x). The program that runs keeps some activations on chip, so this is an upper
    bound on its HBM bytes, never below them."""
    return float(xla_cost(lowered.compile(compiler_options={"xla_msa_enable": False})).get("bytes accessed", 0.0))


def report_compiled(program: Program, chip: str, topology: str, compiled, compile_s: float) -> ProgramReport:
    """What XLA says about ``program`` compiled (``compiled``: its ``jax.stages.Compiled``)."""
    memory = compiled.memory_analysis()
    cost = xla_cost(compiled)
    flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    optimal = cost.get("optimal_seconds")
    text = compiled.as_text()
    loops = loop_factor(text)
    return ProgramReport(
        program.role, program.name, chip, topology, compiled=True, compile_s=compile_s,
        argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
        code_bytes=memory.generated_code_size_in_bytes, flops=flops, bytes_accessed=accessed,
        optimal_s=float(optimal) if optimal is not None and optimal >= 0 else None,
        roofline_s=roofline_seconds(chip, flops, accessed), kernels=compiled_kernels(text),
        loop_factor=loops.factor, loops=len(loops.loops), unknown_loops=loops.unknown_loops,
        full_width=full_width_arrays(text, program.held))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def format_table(reports: list[ProgramReport], hbm_bytes: dict[str, int], planned: dict[str, int]) -> str:
    """A Markdown table: one row per program; ``hbm_bytes`` and ``planned`` per role (bytes per chip)."""
    lines = ["| role | program | topology | compiled | XLA bytes per chip (args + out + temp + code) | planner | HBM "
             "| GFLOP | GB accessed | XLA optimal | roofline | loops x | roofline per run | kernels |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        if not r.compiled:
            lines.append(f"| {r.role} | {r.program} | {r.topology} | error: {r.error} | | | | | | | | | | |")
            continue
        parts = f"{gib(r.peak_bytes)} ({gib(r.argument_bytes)} + {gib(r.output_bytes - r.alias_bytes)} + " \
                f"{gib(r.temp_bytes)} + {gib(r.code_bytes)})"
        plan = gib(planned[r.role]) if r.role in planned else "-"
        hbm = gib(hbm_bytes[r.role]) if r.role in hbm_bytes else "-"
        lines.append(f"| {r.role} | {r.program} | {r.topology} | yes ({r.compile_s:.0f} s) | {parts} | {plan} | {hbm} | "
                     f"{r.flops / 1e9:.4g} | {r.bytes_accessed / 1e9:.4g} | {_seconds(r.optimal_s)} | "
                     f"{_seconds(r.roofline_s)} | {r.loop_factor:.3g} | {_seconds(r.roofline_per_run_s)} | "
                     f"{', '.join(r.kernels) or '-'} |")
    return "\n".join(lines)
