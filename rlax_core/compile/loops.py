"""XLA's cost analysis counts a while loop's body once; a step's real cost runs it trip-count times.

A trainer's update is loops: PPO epochs, mini-batches and micro-batches (``lax.scan``), the layers
(one scanned block), and on TPU the windowed einsums XLA makes of sharded matmuls
(``windowed_dot_general`` loops). ``compiled.cost_analysis()`` sums every instruction of the module
once, so its FLOPs are one trip of each loop. ``loop_factor`` reads the optimised HLO text and
weighs each computation by how many times it runs:

* the multiplicity of a computation is the sum over its call sites of the caller's multiplicity,
  times the loop's trip count where the call is a ``while``'s body or condition (XLA writes a
  known trip count into the loop's ``backend_config``: ``"known_trip_count":{"n":"16"}``);
* the factor is the dot and convolution FLOPs weighed by multiplicity over the same FLOPs counted
  once: a transformer's FLOPs are nearly all products, so the corrected figures are XLA's times it.

Where XLA writes no trip count (libtpu's HLO), a counted loop's is read from its condition
(``counter < constant``, the counter starting at its init's constant). What it cannot know it says:
a loop of any other condition (a ``while_loop`` on data) counts once and is named in ``unknown_loops``; FLOPs inside custom calls (Pallas kernels) and elementwise work
are scaled by the products' factor, not counted apart.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

import numpy as np

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$")
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]\S*")
_OPCODE = re.compile(r"\s+([\w\-]+)\(")
_PARAMETER = re.compile(r"([\w.\-]+):\s*\w+\[([\d,]*)\]")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|branch_computations|called_computations)=\{?([^}),]*(?:,\s*%[\w.\-]+)*)\}?")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_OPERAND = re.compile(r"%([\w.\-]+)")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_WINDOW_FIELD = re.compile(r"(\w+)=([\w\-x]+)")


@dataclasses.dataclass(frozen=True)
class LoopFactor:
    """``factor``: the products' FLOPs with every loop run its trips over XLA's count (>= 1);
    ``loops``: each while loop's name and trip count; ``unknown_loops``: those counted once."""

    factor: float
    loops: tuple[tuple[str, int], ...]
    unknown_loops: tuple[str, ...]
    product_flops_once: float
    product_flops: float


def loop_factor(hlo_text: str) -> LoopFactor:
    """The trip-count correction of an optimised HLO module's cost (see the module docstring)."""
    computations, entry = _parse(hlo_text)
    calls: dict[str, list[tuple[str, int]]] = defaultdict(list)  # callee -> (caller, trips per call)
    loops, unknown = [], []
    for name, (_, instructions) in computations.items():
        for inst_name, _, _, opcode, rest in instructions:
            trips = 1
            if opcode == "while":
                found = _TRIP_COUNT.search(rest)
                trips = int(found.group(1)) if found else _counted_trips(computations, name, rest)
                if trips is None:
                    trips = 1
                    unknown.append(inst_name)
                else:
                    loops.append((inst_name, trips))
            for key, targets in _CALLED.findall(rest):
                for callee in _OPERAND.findall(targets) or [targets.strip()]:
                    if callee in computations:
                        calls[callee].append((name, trips if key in ("body", "condition") else 1))
    multiplicity: dict[str, float] = {}

    def times(name: str, seen=()) -> float:
        if name == entry:
            return 1.0
        if name not in multiplicity:
            multiplicity[name] = sum(times(caller, seen + (name,)) * trips
                                     for caller, trips in calls.get(name, ()) if caller not in seen)
        return multiplicity[name]

    once = weighed = 0.0
    for name, (shapes, instructions) in computations.items():
        flops = sum(_product_flops(shapes, inst) for inst in instructions)
        if flops and (name == entry or calls.get(name)):
            once += flops
            weighed += flops * times(name)
    return LoopFactor(factor=weighed / once if once else 1.0, loops=tuple(loops), unknown_loops=tuple(unknown),
                      product_flops_once=once, product_flops=weighed)


def _counted_trips(computations, caller: str, rest: str) -> int | None:
    """A counted loop's trips where XLA wrote no ``known_trip_count`` (libtpu's HLO): its condition
    is ``counter < N`` with N a constant, the counter the tuple element ``index=k``, which starts at
    the constant the loop's init tuple holds there (through copies and bitcasts; 0 when it is no
    constant: JAX's scans and fori_loops count from 0). None for any other condition."""
    condition = re.search(r"condition=%?([\w.\-]+)", rest)
    if not condition or condition.group(1) not in computations:
        return None
    _, body = computations[condition.group(1)]
    by_name = {inst[0]: inst for inst in body}
    root = body[-1] if body else None
    if root is None or root[3] != "compare" or "direction=LT" not in root[4]:
        return None
    left, right = _OPERAND.findall(root[4].split(")", 1)[0])[:2]
    counter, bound = by_name.get(left), by_name.get(right)
    if counter is None or bound is None or counter[3] != "get-tuple-element" or bound[3] != "constant":
        return None
    limit = _constant(bound)
    index = re.search(r"index=(\d+)", counter[4])
    start = 0
    init = _OPERAND.findall(rest.split(")", 1)[0])
    caller_body = {inst[0]: inst for inst in computations[caller][1]}
    tuple_ = caller_body.get(init[0]) if init else None
    if tuple_ is not None and tuple_[3] == "tuple" and index:
        element = _OPERAND.findall(re.sub(r"/\*.*?\*/", "", tuple_[4]).split(")", 1)[0])[int(index.group(1))]
        while element in caller_body and caller_body[element][3] in ("copy", "bitcast"):
            element = _OPERAND.findall(caller_body[element][4])[0]
        if element in caller_body and caller_body[element][3] == "constant":
            start = _constant(caller_body[element]) or 0
    return None if limit is None else max(0, limit - start)


def _constant(instruction) -> int | None:
    found = re.match(r"\s*(-?\d+)\)", instruction[4])
    return int(found.group(1)) if found else None


def _parse(hlo_text: str):
    """name -> (value shapes by name, instructions (name, dtype, dims, opcode, rest)); the entry's name."""
    computations, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            if line.startswith("ENTRY"):
                entry = current
            shapes = {p: _dims(d) for p, d in _PARAMETER.findall(header.group(2))}
            computations[current] = (shapes, [])
            continue
        inst = _instruction(line) if current else None
        if inst:
            computations[current][0][inst[0]] = _dims(inst[2])
            computations[current][1].append(inst)
    return computations, entry


def _instruction(line: str):
    """(name, dtype, dims, opcode, rest) of ``%name = f32[8,64]{1,0} dot(...`` (a tuple-shaped one,
    ``%w = (s32[], f32[8]) while(...``, has dtype and dims ""), or None."""
    head = _NAME.match(line)
    if not head:
        return None
    position, dtype, dims = head.end(), "", ""
    if line.startswith("(", position):  # a tuple shape: skip to its closing parenthesis
        depth = 0
        for position in range(position, len(line)):
            depth += {"(": 1, ")": -1}.get(line[position], 0)
            if depth == 0:
                break
        position += 1
    else:
        shape = _ARRAY.match(line, position)
        if not shape:
            return None
        dtype, dims, position = shape.group(1), shape.group(2), shape.end()
    op = _OPCODE.match(line, position)
    return (head.group(1), dtype, dims, op.group(1), line[op.end():]) if op else None


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d)


def _product_flops(shapes, instruction) -> float:
    """2 x output elements x contracted elements of a dot (a convolution: its kernel's input
    features and window, read from the kernel operand's shape over its output features)."""
    _, _, dims, opcode, rest = instruction
    out = 1
    for d in _dims(dims):
        out *= d
    operands = _OPERAND.findall(rest.split(")", 1)[0])
    if opcode == "dot":
        contracting = _CONTRACTING.search(rest)
        lhs = shapes.get(operands[0]) if operands else None
        if lhs is None or contracting is None:
            return 0.0
        inner = 1
        for axis in _dims(contracting.group(1)):
            inner *= lhs[axis]
        return 2.0 * out * inner
    if opcode == "convolution" and len(operands) > 1:
        return _convolution_flops(shapes.get(operands[0]), shapes.get(operands[1]), _dims(dims), rest)
    return 0.0


def _convolution_flops(lhs, rhs, out, rest) -> float:
    """2 x the multiply-adds of a convolution (XLA writes sharded and batched matmuls as
    convolutions on TPU): per output element, the kernel's input features times the window positions
    that fall inside the (padded) input, counted dimension by dimension as XLA's cost analysis does."""
    labels = _DIM_LABELS.search(rest)
    if lhs is None or rhs is None or labels is None:
        return 0.0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    window = _WINDOW.search(rest)
    fields = dict(_WINDOW_FIELD.findall(window.group(1))) if window else {}
    spatial = [c for c in rhs_labels if c.isdigit()]
    sizes = [int(x) for x in fields.get("size", "").split("x") if x] or [1] * len(spatial)
    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else \
        [(0, 0)] * len(spatial)
    strides = [int(x) for x in fields["stride"].split("x")] if "stride" in fields else [1] * len(spatial)
    total = 2.0 * rhs[rhs_labels.index("i")]
    for name, size in zip(out_labels, out):
        if not name.isdigit():
            total *= size
    for index, name in enumerate(spatial):
        inputs, outputs = lhs[lhs_labels.index(name)], out[out_labels.index(name)]
        taps = np.arange(outputs)[:, None] * strides[index] + np.arange(sizes[index])[None, :] - pads[index][0]
        total *= int(np.count_nonzero((taps >= 0) & (taps < inputs)))
    return total
