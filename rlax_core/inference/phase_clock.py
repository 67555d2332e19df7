"""Where an engine's time goes: seconds per program, each call waited for.

The engine dispatches a prefill without waiting for it (the next decode call's results wait), so a
wall clock around its calls would put a prefill's time on the decode after it. A clock waits for
each program's output before it stops, which serialises the host with the device: a measurement
(``benchmarks/engine_memory.py``), never a run's default.

    engine.clock = PhaseClock()
    engine.generate(requests)
    engine.clock.seconds  # {"prefill": ..., "decode": ...}
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import jax


class PhaseClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, output: Callable[[], Any]) -> Iterator[None]:
        """Time the block to the moment ``output()`` (what it computed) is ready."""
        started = time.perf_counter()
        yield
        jax.block_until_ready(output())
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def timed(clock: PhaseClock | None, name: str, output: Callable[[], Any]):
    """``clock.phase(name, output)``, or nothing at all without a clock."""
    return contextlib.nullcontext() if clock is None else clock.phase(name, output)
