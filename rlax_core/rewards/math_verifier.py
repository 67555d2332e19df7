"""Are two math answers equal? Quantities here, everything else through math-verify in a killable pool.

Numbers as answers write them (thousands separators, currency, percent, magnitude words, units:
``rlax_core.rewards.quantities``) are compared in-process: exactly when the gold is an integer or both
are exact, else with a tolerance relative to the gold answer's size (either was written with a
decimal point). They never need the pool.

Parsing LaTeX and simplifying with sympy can take unbounded time and memory (``10^{10^{10^{10}}}``,
a thousand nested parentheses). So math-verify never runs in the caller: it runs in a pool of worker
processes (pebble), each comparison under an interval timer in the worker (half the hard limit) and
a hard timeout outside it; a worker that overruns the hard limit is killed and replaced. Either way
the verdict is "not equal" with the reason ``timeout``, never ``not_equal``: the answer may have
been right. It earns no reward all the same, because a reward for answers too costly to check would
teach a policy to write them. Workers also carry an address-space limit, so a runaway
simplification ends in ``MemoryError`` inside the worker rather than in the host's memory.

Inside a worker, two answers that both parse to real numbers (``\\frac{1}{3}``, ``0.333333``,
``5\\times10^{-7}``) are compared by the same rule as quantities: exactly when both are exact or the
gold is an integer, else within ``relative_tolerance`` of the gold's size (math-verify's own rounding
to 6 decimals would take ``0.0`` for a gold ``5\\times10^{-7}``). Anything else is math-verify's
symbolic comparison.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import io
import multiprocessing
import multiprocessing.context
import os
import threading
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from typing import Iterable

import pebble

from rlax_core.config import require
from rlax_core.rewards.math_symbolic import verdict
from rlax_core.rewards.quantities import (MAGNITUDE_WORD, plain_number, quantities_equal, read_quantity, strip_answer,
                                          word_that_is_no_unit)

MATH_REASONS = ("exact", "numeric", "symbolic", "not_equal", "timeout", "too_long", "error")
EQUAL_REASONS = ("exact", "numeric", "symbolic")
__all__ = ["MATH_REASONS", "MathResult", "MathVerifier", "MathVerifierConfig", "default_math_verifier",
           "math_equal", "plain_number"]


@dataclasses.dataclass(frozen=True)
class MathVerifierConfig:
    workers: int = 1  # processes running math-verify
    timeout_seconds: float = 10.0  # hard limit per comparison; the worker is killed past it
    memory_bytes: int = 2 << 30  # address-space limit of each worker
    # of the gold's size, when either number was written with a decimal point (exact ones: exactly)
    relative_tolerance: float = 1e-6
    max_answer_chars: int = 2000  # longer answers are not equal, without parsing
    # An interval timer in the worker at half the hard limit ends most overruns there (reason
    # "timeout"), and the worker needs no replacement; the hard limit stands behind it either way.
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


class _WorkerPopen(popen_forkserver.Popen):
    """Starts a worker from the fork server without re-running the caller's ``__main__`` in it.

    multiprocessing imports the main script again in every child (so that functions defined there
    unpickle): a script that calls ``math_equal`` at its top level, without an ``if __name__ ==
    "__main__":`` guard, would run again inside the worker and fail there ("An attempt has been made
    to start a new process before the current process has finished its bootstrapping phase"). Our
    workers run only this package's functions, so their preparation data names no main module. The
    rest is the standard library's ``popen_forkserver.Popen._launch`` (Python 3.11).
    """

    def _launch(self, process_obj):
        prep_data = {key: value for key, value in spawn.get_preparation_data(process_obj._name).items()
                     if key not in ("init_main_from_name", "init_main_from_path")}
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)  # the child's sentinel of its parent, as the standard library keeps it
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _WorkerProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _WorkerPopen(process_obj)


class _WorkerContext(multiprocessing.context.ForkServerContext):
    Process = _WorkerProcess


def _fork_server() -> multiprocessing.context.BaseContext:
    """Workers forked from a single-threaded server that has math-verify loaded and warm.

    Not plain fork: the caller may hold threads (JAX, Beam) that a fork would copy mid-lock. Not
    spawn: a worker replacing a killed one would need seconds to import sympy, and the next
    comparison would wait for it.
    """
    context = _WorkerContext()
    context.set_forkserver_preload([WARM_WORKER_MODULE])  # applies when the server starts
    return context



class MathVerifier:
    """Answer equivalence with a hard per-call timeout; safe to call from many threads."""

    def __init__(self, config: MathVerifierConfig = MathVerifierConfig()):
        self.config = config
        self._pool: pebble.ProcessPool | None = None
        self._lock = threading.Lock()
        self._soft_seconds = config.timeout_seconds / 2 if config.inner_timeouts else None

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
        if strip_answer(gold) == strip_answer(prediction):
            return MathResult(True, "exact")
        a, b = read_quantity(gold), read_quantity(prediction)
        if a is not None and b is not None:
            equal = quantities_equal(a, b, self.config.relative_tolerance)
            return MathResult(equal, "numeric" if equal else "not_equal")
        # A number followed by a word that is no unit ("18 apples", "18 less") is not that number, and
        # a magnitude word the quantity reader could not take with its number ("\\frac12 million")
        # is not to be dropped: math-verify's parser drops either at its whim, so decide here.
        for text, quantity in ((gold, a), (prediction, b)):
            if quantity is None and (word_that_is_no_unit(text) or MAGNITUDE_WORD.search(text)):
                return MathResult(False, "not_equal")
        return None

    def _submit(self, gold: str, prediction: str) -> concurrent.futures.Future:
        return self._get_pool().schedule(verdict, args=(gold, prediction, self._soft_seconds,
                                                        self.config.relative_tolerance),
                                         timeout=self.config.timeout_seconds)

    @staticmethod
    def _collect(future: concurrent.futures.Future) -> MathResult:
        try:
            reason = future.result()
        except concurrent.futures.TimeoutError:  # the hard limit: the worker was killed
            return MathResult(False, "timeout")
        except Exception:  # noqa: BLE001 - a crashed worker (pebble.ProcessExpired), MemoryError, parse bugs
            return MathResult(False, "error")
        return MathResult(reason in EQUAL_REASONS, reason)

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
