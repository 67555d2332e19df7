"""Are two math answers equal? Plain numbers here, everything else through math-verify in a killable pool.

Parsing LaTeX and simplifying with sympy can take unbounded time and memory (``10^{10^{10^{10}}}``,
a thousand nested parentheses). So math-verify never runs in the caller: it runs in a pool of worker
processes (pebble), each task with a hard timeout; a worker that overruns is killed and replaced, and
the call answers "not equal" with the reason ``timeout``. Workers also carry an address-space limit, so
a runaway simplification ends in ``MemoryError`` inside the worker rather than in the host's memory.

Numbers with thousands separators, signs, decimals or a currency sign (GSM8K-style) are compared
in-process with a relative tolerance; they never need the pool.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import math
import multiprocessing
import re
import threading
from typing import Iterable

import pebble

from rlax_core.config import require
from rlax_core.rewards.math_symbolic import symbolic_equal

MATH_REASONS = ("exact", "numeric", "symbolic", "not_equal", "timeout", "too_long", "error")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+")
_NUMBER_THEN_WORDS = re.compile(r"(\$?\s*[-+]?[\d,]*\.?\d+)(?:%|(?:\s+[A-Za-z]+\.?)+)")
_OPENERS, _CLOSERS = ("\\$", "$", "\\(", "\\["), ("$", "\\)", "\\]")


@dataclasses.dataclass(frozen=True)
class MathVerifierConfig:
    workers: int = 1  # processes running math-verify
    timeout_seconds: float = 10.0  # hard limit per comparison; the worker is killed past it
    memory_bytes: int = 2 << 30  # address-space limit of each worker
    relative_tolerance: float = 1e-6  # for plain numbers
    max_answer_chars: int = 2000  # longer answers are not equal, without parsing
    # math-verify's own signal-based timeouts (half the hard limit per stage) end most overruns inside
    # the worker, which then needs no replacement; the hard limit stands behind them either way.
    inner_timeouts: bool = True

    def __post_init__(self):
        require(self.workers >= 1, "workers", "must be >= 1")
        require(self.timeout_seconds > 0, "timeout_seconds", "must be > 0")
        require(self.memory_bytes >= 256 << 20, "memory_bytes", "must be >= 256 MiB (sympy needs ~150 MiB)")
        require(0 <= self.relative_tolerance < 1, "relative_tolerance", "must be in [0, 1)")
        require(self.max_answer_chars >= 1, "max_answer_chars", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class MathResult:
    equal: bool
    reason: str  # one of MATH_REASONS


def _strip_answer(text: str) -> str:
    """Without surrounding space, a final full stop, and one pair of math delimiters (``$...$``, ``\\(...\\)``)."""
    text = text.strip().removesuffix(".").strip()
    text = next((text[len(o):] for o in _OPENERS if text.startswith(o)), text)
    text = next((text[:-len(c)] for c in _CLOSERS if text.endswith(c)), text)
    return text.strip()


def plain_number(text: str) -> float | None:
    """``"1,234.50"`` / ``"$-7"`` / ``"3."`` as a float; None for anything that is not a plain number."""
    if len(text) > 256:
        return None
    text = _strip_answer(text)
    if len(text) > 64 or not _PLAIN_NUMBER.fullmatch(text):
        return None
    return float(text.replace(",", ""))


def number_with_units(text: str) -> float | None:
    """``"18 dollars"`` / ``"$18.00 per week"`` as 18.0: a plain number followed by words only."""
    if len(text) > 256:
        return None
    match = _NUMBER_THEN_WORDS.fullmatch(_strip_answer(text))
    return plain_number(match.group(1)) if match else None


def _numbers_equal(a: float, b: float, relative_tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=relative_tolerance, abs_tol=relative_tolerance)


# ----------------------------------------------------------------------------- inside a worker process


# The module the fork server imports before forking any worker (math-verify loaded, sympy warm). Named,
# not imported: the caller never loads it.
WARM_WORKER_MODULE = "rlax_core.rewards.math_worker"


def _worker_init(memory_bytes: int) -> None:
    import importlib
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    importlib.import_module(WARM_WORKER_MODULE)  # a no-op when the fork server preloaded it


# ----------------------------------------------------------------------------- the caller's side


def _fork_server() -> multiprocessing.context.BaseContext:
    """Workers forked from a single-threaded server that has math-verify loaded and warm.

    Not plain fork: the caller may hold threads (JAX, Beam) that a fork would copy mid-lock. Not
    spawn: a worker replacing a killed one would need seconds to import sympy, and the next
    comparison would wait for it.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([WARM_WORKER_MODULE])  # applies when the server starts
    return context



class MathVerifier:
    """Answer equivalence with a hard per-call timeout; safe to call from many threads."""

    def __init__(self, config: MathVerifierConfig = MathVerifierConfig()):
        self.config = config
        self._pool: pebble.ProcessPool | None = None
        self._lock = threading.Lock()
        self._soft_seconds = max(1, int(config.timeout_seconds // 2)) if config.inner_timeouts else None

    def _get_pool(self) -> pebble.ProcessPool:
        with self._lock:
            if self._pool is None:
                self._pool = pebble.ProcessPool(max_workers=self.config.workers, initializer=_worker_init,
                                                initargs=(self.config.memory_bytes,), context=_fork_server())
            return self._pool

    def _fast(self, gold: str, prediction: str) -> MathResult | None:
        """A verdict without the pool, when one is certain."""
        if len(gold) > self.config.max_answer_chars or len(prediction) > self.config.max_answer_chars:
            return MathResult(False, "too_long")
        if _strip_answer(gold) == _strip_answer(prediction):
            return MathResult(True, "exact")
        a, b = plain_number(gold), plain_number(prediction)
        if a is not None and b is None:  # GSM8K style: the gold is a number, the prediction may carry a unit
            b = number_with_units(prediction)
        if a is not None and b is not None:
            equal = _numbers_equal(a, b, self.config.relative_tolerance)
            return MathResult(equal, "numeric" if equal else "not_equal")
        return None

    def _submit(self, gold: str, prediction: str) -> concurrent.futures.Future:
        return self._get_pool().schedule(symbolic_equal, args=(gold, prediction, self._soft_seconds),
                                         timeout=self.config.timeout_seconds)

    @staticmethod
    def _collect(future: concurrent.futures.Future) -> MathResult:
        try:
            equal = future.result()
        except concurrent.futures.TimeoutError:
            return MathResult(False, "timeout")
        except Exception:  # noqa: BLE001 - a crashed worker (pebble.ProcessExpired), MemoryError, parse bugs
            return MathResult(False, "error")
        return MathResult(True, "symbolic") if equal else MathResult(False, "not_equal")

    def compare(self, gold: str, prediction: str) -> MathResult:
        return self.compare_many([(gold, prediction)])[0]

    def compare_many(self, pairs: Iterable[tuple[str, str]]) -> list[MathResult]:
        """Results in input order; pairs needing math-verify run in parallel across the workers."""
        results: list[MathResult | concurrent.futures.Future] = []
        for gold, prediction in pairs:
            gold, prediction = str(gold), str(prediction)
            results.append(self._fast(gold, prediction) or self._submit(gold, prediction))
        return [r if isinstance(r, MathResult) else self._collect(r) for r in results]

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.stop()
                self._pool.join(timeout=10)
                self._pool = None

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_math_verifier() -> MathVerifier:
    """The process-wide verifier behind :func:`math_equal` (one worker, 10 s timeout), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
            atexit.register(_default.close)
        return _default


def math_equal(gold: str, prediction: str) -> bool:
    """Whether ``prediction`` is mathematically the same answer as ``gold``; never hangs (10 s at most)."""
    return default_math_verifier().compare(gold, prediction).equal
