"""Are two math answers equal? Quantities here, everything else through math-verify in a killable pool.

Numbers as answers write them (thousands separators, currency, percent, magnitude words, units:
``rlax_core.rewards.quantities``) are compared in-process: exactly when the gold is an integer or both
are exact, else with a tolerance relative to the gold answer's size (either was written with a
decimal point). They never need the pool.

Parsing LaTeX and simplifying with sympy can take unbounded time and memory (``10^{10^{10^{10}}}``,
a thousand nested parentheses). So math-verify never runs in the caller: it runs in worker processes
(``rlax_core.rewards.math_worker``: forks of a warm parent process that is started with fork and exec,
so none of the caller's threads or its ``__main__`` comes along), each comparison under an interval
timer in the worker (half the hard limit) and a hard timeout outside it; a worker that overruns the
hard limit is killed and replaced. Either way the verdict is "not equal" with the reason ``timeout``,
never ``not_equal``: the answer may have been right. It earns no reward all the same, because a
reward for answers too costly to check would teach a policy to write them. Workers also carry an
address-space limit, so a runaway
simplification ends in ``MemoryError`` inside the worker rather than in the host's memory.

Inside a worker, two answers that both parse to real numbers (``\\frac{1}{3}``, ``0.333333``,
``5\\times10^{-7}``) are compared by the same rule as quantities: exactly when both are exact or the
gold is an integer, else within ``relative_tolerance`` of the gold's size (math-verify's own rounding
to 6 decimals would take ``0.0`` for a gold ``5\\times10^{-7}``). Anything else is math-verify's
symbolic comparison.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterable

from rlax_core.config import require
from rlax_core.rewards.math_worker import READY, SPAWN, recv_frame, send_frame
from rlax_core.rewards.math_symbolic import verdict
from rlax_core.rewards.quantities import (MAGNITUDE_WORD, plain_number, quantities_equal, read_quantity, strip_answer,
                                          word_that_is_no_unit)

log = logging.getLogger(__name__)

MATH_REASONS = ("exact", "numeric", "symbolic", "not_equal", "timeout", "too_long", "error")
EQUAL_REASONS = ("exact", "numeric", "symbolic")
WORKER_MODULE = "rlax_core.rewards.math_worker"
_BATCH = 8  # comparisons per exchange with a worker: fewer round trips through a loaded host's scheduler
_SPAWN_SECONDS = 60.0  # a fork of a warm process takes milliseconds; this is the loud end of a wedged one
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
    startup_seconds: float = 120.0  # for the worker parent to import math-verify and warm sympy, once

    def __post_init__(self):
        require(self.workers >= 1, "workers", "must be >= 1")
        require(self.timeout_seconds > 0, "timeout_seconds", "must be > 0")
        require(self.startup_seconds > 0, "startup_seconds", "must be > 0")
        require(self.memory_bytes >= 256 << 20, "memory_bytes", "must be >= 256 MiB (sympy needs ~150 MiB)")
        require(0 <= self.relative_tolerance < 1, "relative_tolerance", "must be in [0, 1)")
        require(self.max_answer_chars >= 1, "max_answer_chars", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class MathResult:
    equal: bool
    reason: str  # one of MATH_REASONS


# ----------------------------------------------------------------------------- the workers


class _WorkerParent:
    """``rlax_core.rewards.math_worker.main`` in its own interpreter: a warm process that forks a worker on request.

    Started with fork and exec (``subprocess``), never a plain fork of the caller, which may hold
    threads (JAX, Beam) mid-lock; and nothing of the caller's ``__main__`` runs in it, so a script
    may call :func:`math_equal` at its top level without a main guard. Its workers are forks of a
    process that has math-verify loaded and sympy warm: a worker replacing a killed one is ready in
    milliseconds, not the seconds a fresh interpreter would need to import sympy.
    """

    def __init__(self, memory_bytes: int, startup_seconds: float):
        ours, theirs = socket.socketpair()
        # Blocking whatever socket.getdefaulttimeout() is (Beam's GCS credentials set it to 60 s for the
        # whole process): the parent would inherit O_NONBLOCK and end at its first recv with nothing queued.
        theirs.setblocking(True)
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                                         os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            # -c, not -m: the package (imported first) already holds the module, which runpy warns about
            [sys.executable, "-c", f"import sys; from {WORKER_MODULE} import main; main(sys.argv[1:])",
             str(theirs.fileno()), str(memory_bytes)],
            # cwd "/": it outlives the caller's working folder, which may be a temporary one deleted later.
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd="/")
        theirs.close()
        self._control = ours
        self._lock = threading.Lock()
        self._control.settimeout(startup_seconds)
        try:
            ready = self._control.recv(len(READY))
        except OSError:  # socket.timeout included
            ready = b""
        if ready != READY:
            self.close()
            raise RuntimeError(f"the math worker parent ({WORKER_MODULE}) did not start within "
                               f"{startup_seconds:g} s (exit status {self._process.poll()})")
        self._control.settimeout(_SPAWN_SECONDS)

    def spawn(self) -> "_Worker":
        with self._lock:
            self._control.sendall(SPAWN)
            pid, fds, _, _ = socket.recv_fds(self._control, 32, 2)
        if not pid and not fds:
            raise ConnectionResetError("the math worker parent closed its socket")
        if not fds:
            raise RuntimeError(f"the math worker parent sent no worker ({pid!r})")
        return _Worker(int(pid), socket.socket(fileno=fds[0]), fds[1] if len(fds) > 1 else None)

    def exit_status(self) -> int | None:
        return self._process.poll()

    def close(self) -> None:
        self._control.close()  # the parent kills its process group, workers included, when this closes
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)


@dataclasses.dataclass
class _Worker:
    pid: int
    conn: socket.socket
    pidfd: int | None = None  # the process itself: a pid may name another process once this one ended

    def kill(self) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:  # a kernel without pidfds (before Linux 5.3)
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # it had died already
            pass
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
            self.conn.close()


# ----------------------------------------------------------------------------- the caller's side


class MathVerifier:
    """Answer equivalence with a hard per-call timeout; safe to call from many threads."""

    def __init__(self, config: MathVerifierConfig = MathVerifierConfig()):
        self.config = config
        self._lock = threading.Lock()
        self._soft_seconds = config.timeout_seconds / 2 if config.inner_timeouts else None
        self._parent: _WorkerParent | None = None
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        # One slot per worker; a slot holds None until its worker is forked, and again after it is killed.
        self._slots: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()

    def _start(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._parent = _WorkerParent(self.config.memory_bytes, self.config.startup_seconds)
                for _ in range(self.config.workers):
                    self._slots.put(None)
                self._threads = concurrent.futures.ThreadPoolExecutor(self.config.workers,
                                                                      thread_name_prefix="math-verifier")
            return self._threads

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

    def _spawn(self) -> "_Worker":
        """A worker from the warm parent; a parent found gone (killed, or its socket closed) is replaced
        once, so that one lost helper process costs a start-up, not the batch."""
        parent = self._parent
        try:
            return parent.spawn()
        except OSError:  # ECONNRESET, EPIPE, a closed socket: the parent is gone
            with self._lock:
                if self._parent is parent:
                    log.warning("the math worker parent is gone (exit status %s); starting another",
                                parent.exit_status())
                    parent.close()
                    self._parent = _WorkerParent(self.config.memory_bytes, self.config.startup_seconds)
            return self._parent.spawn()

    def _drain(self, pending: collections.deque, results: list, lock: threading.Lock) -> None:
        """Runs pending comparisons on one worker, a few per exchange, until none is left."""
        worker = self._slots.get(timeout=_SPAWN_SECONDS)  # never waits: one worker per thread
        try:
            while True:
                with lock:  # a few at a time: the worker starts each the moment it ends the last
                    count = min(len(pending), _BATCH, -(-len(pending) // self.config.workers))
                    batch = [pending.popleft() for _ in range(count)]
                if not batch:
                    return
                worker = worker or self._spawn()
                done = self._exchange(worker, batch, results)
                if done < len(batch):  # the worker was killed at batch[done]; the rest go to its successor
                    worker = None
                    with lock:
                        pending.extendleft(reversed(batch[done + 1:]))
        finally:
            self._slots.put(worker)

    def _exchange(self, worker: _Worker, batch: list, results: list) -> int:
        """Sends a batch, reads its verdicts into ``results``; the index of a failed one (its worker killed), or the batch's size.

        The hard limit counts for each comparison from the previous verdict (or the send), when the
        worker begins it.
        """
        timeout, position = self.config.timeout_seconds, 0
        try:
            worker.conn.settimeout(timeout)
            send_frame(worker.conn, [[gold, prediction, self._soft_seconds, self.config.relative_tolerance]
                                     for _, gold, prediction in batch])
            for position, (index, _, _) in enumerate(batch):
                worker.conn.settimeout(timeout)
                reply = recv_frame(worker.conn)
                if reply is None:
                    raise ConnectionError("the worker died")  # the kernel's OOM killer, a crash in C
                reason = reply.get("reason")
                results[index] = MathResult(reason in EQUAL_REASONS, reason if reason in MATH_REASONS else "error")
            return len(batch)
        except TimeoutError:  # the hard limit: the worker is killed, the next exchange forks another
            reason = "timeout"
        except (OSError, ValueError):  # a crashed worker, a garbled frame
            reason = "error"
        worker.kill()
        results[batch[position][0]] = MathResult(False, reason)
        return position

    def compare(self, gold: str, prediction: str) -> MathResult:
        return self.compare_many([(gold, prediction)])[0]

    def compare_many(self, pairs: Iterable[tuple[str, str]]) -> list[MathResult]:
        """Results in input order; pairs needing math-verify run in parallel across the workers."""
        results: list[MathResult | None] = []
        pending: collections.deque = collections.deque()
        for gold, prediction in pairs:
            gold, prediction = str(gold), str(prediction)
            results.append(self._fast(gold, prediction))
            if results[-1] is None:
                pending.append((len(results) - 1, gold, prediction))
        if pending:
            threads, lock = self._start(), threading.Lock()
            drains = [threads.submit(self._drain, pending, results, lock)
                      for _ in range(min(self.config.workers, len(pending)))]
            for drain in drains:
                drain.result()
        return results

    def close(self) -> None:
        with self._lock:
            if self._threads is None:
                return
            self._threads.shutdown(wait=True, cancel_futures=True)
            for _ in range(self.config.workers):
                worker = self._slots.get(timeout=_SPAWN_SECONDS)
                if worker is not None:
                    worker.kill()
            self._parent.close()
            self._parent = self._threads = None

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
