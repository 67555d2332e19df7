"""What one decode step costs a chip: the HBM bytes of the compiled step plus the KV pages its paged
attention reads, and the check that the compiled decode forms no full-width copy of the pool or weights.

XLA's cost analysis does not see inside a Mosaic (or Triton) call, so the decode program's bytes
leave out exactly the bytes that grow with the running sequences and their lengths: the KV pages.
``DecodeStepCost`` adds them, counted by ``planning.memory.decode_kv_read_bytes`` (whole pages,
keys and values, every layer, the chip's KV heads, by ``engine.cache_dtype``; an eight-bit page
with its row of float32 scales, as our kernel reads it):

    step bytes(contexts) = HBM bytes of the compiled step + sum over running sequences of
                           ceil(context / page_size) x (bytes one page holds on one chip)

The compiled step's HBM bytes are XLA's bytes accessed, on TPU of the program compiled with
memory-space assignment off (``decode_step_bytes``; ``compile.report.hbm_bytes_accessed``): XLA:TPU's
own count of the program as it runs adds the on-chip copies of the weights it prefetches, up to three
times their bytes. Its time is the roofline ``max(FLOPs / peak, bytes / HBM bandwidth)``, XLA's FLOPs
scaled by the running sequences over the compiled slots (the projections' rows; the kernel's FLOPs are
not counted: a decode step is bound by its bytes at every width here). XLA's bytes are those of the
program as compiled (its slots' activations with them), so a step of fewer running sequences is
counted with the compiled slots' activations: on the safe side, and a few percent of the weights' bytes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Sequence

from rlax_core.planning.hardware import CHIP_PEAKS


@dataclasses.dataclass(frozen=True)
class DecodeStepCost:
    """One chip's decode step of an engine replica as a function of its running sequences."""

    chip: str
    slots: int  # the compiled program's
    xla_flops: float  # one step of every slot (XLA counts the decode loop's body once)
    xla_bytes: float
    kv_bytes_per_page: float  # one page of one running sequence, on one chip (decode_kv_read_bytes)
    page_size: int

    def kv_read_bytes(self, contexts: Iterable[float]) -> float:
        return sum(-(-int(c) // self.page_size) for c in contexts) * self.kv_bytes_per_page

    def bytes(self, contexts: Sequence[float]) -> float:
        return self.xla_bytes + self.kv_read_bytes(contexts)

    def seconds(self, contexts: Sequence[float]) -> float:
        """Roofline seconds of one step with these running sequences (their context lengths)."""
        peak = CHIP_PEAKS[self.chip]
        flops = self.xla_flops * len(contexts) / self.slots
        return max(flops / peak.bf16_flops, self.bytes(contexts) / peak.hbm_bytes_per_s)

    def seconds_at(self, sequences: int, mean_context: float) -> float:
        """``seconds`` of ``sequences`` running sequences each at ``mean_context`` tokens."""
        return self.seconds([mean_context] * sequences)


# The name ``compile.programs`` gives a decode program: "decode 256 slots x 16 steps (tpu)".
DECODE_PROGRAM = re.compile(r"^decode (\d+) slots x (\d+) steps")


def decode_step_bytes(program: Mapping[str, Any]) -> float:
    """The bytes a decode step's cost starts from, of a compiled program's report (``ProgramReport``'s
    fields or its JSON): its HBM bytes where they were counted (``hbm_bytes_accessed``: TPU, see
    ``compile.report.hbm_bytes_accessed``), else XLA's bytes accessed."""
    hbm = program.get("hbm_bytes_accessed")
    return float(program["bytes_accessed"] if hbm is None else hbm)


# HLO dtype names of the dtypes an engine holds, and which are narrower than which.
_HLO_DTYPE = {"bfloat16": "bf16", "float32": "f32", "float16": "f16", "int8": "s8", "float8_e4m3fn": "f8e4m3fn"}
_WIDTH = {"s8": 1, "f8e4m3fn": 1, "bf16": 2, "f16": 2, "f32": 4}
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(")
# Instructions that name a buffer without forming one.
_NOT_A_BUFFER = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant"}
_FUSED = re.compile(r"\bcalls=%([\w.\-]+)")


def hlo_dtype(name: str) -> str:
    return _HLO_DTYPE.get(name, name)


def full_width_arrays(hlo_text: str, held: Iterable[tuple[str, tuple[int, ...]]]) -> tuple[str, ...]:
    """Buffers of an optimised HLO module that copy a held array whole: ``held`` lists (dtype, shape
    on one chip) of the arrays the program holds (KV pools, weights). A buffer counts when XLA
    materialises it (an instruction outside a fusion's body) with a held array's shape and either
    copies it (``copy``) or holds it wider than it is held (a dequantised pool or kernel, or scales
    broadcast to it). Each is named ``"<instruction> = <dtype>[shape] <op> (where)"``: "once a call"
    in the entry computation, else the computation holding it (the decode loop's body: every step)."""
    held = {(hlo_dtype(dtype), tuple(shape)) for dtype, shape in held if len(shape) >= 2}
    shapes = {}
    for dtype, shape in held:
        shapes.setdefault(shape, []).append(dtype)
    fused = set(_FUSED.findall(hlo_text))
    found, inside, entry = [], None, False
    for line in hlo_text.splitlines():
        start = _COMPUTATION.match(line)
        if start:
            inside, entry = start.group(2), bool(start.group(1))
            continue
        match = _INSTRUCTION.match(line)
        if not match or inside in fused:
            continue
        name, dtype, dims, op = match.groups()
        shape = tuple(int(d) for d in dims.split(",") if d)
        stored = shapes.get(shape, ())
        if op in _NOT_A_BUFFER or not stored:
            continue
        if (op == "copy" and dtype in stored) or (dtype not in stored and _WIDTH.get(dtype, 0) > min(
                _WIDTH.get(s, 99) for s in stored)):
            found.append(f"{name} = {dtype}[{dims}] {op} ({'once a call' if entry else 'in ' + inside})")
    return tuple(found)
