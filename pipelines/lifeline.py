"""Jobs owned by the process that starts them: they die with it, however it dies (SIGKILL included).

``rlax launch`` and ``rlax quickstart`` start their jobs with :func:`spawn`. A job starts its own
process group (so that stopping it reaches what it started: Prism, scorer pools, sandbox launchers)
and receives the read end of a pipe whose write end only its owner holds: a lease that the kernel
ends, because a dying process's files are closed whatever killed it. ``pipelines.cli`` calls
:func:`hold` first thing: a thread waits on that end and, at end of file, SIGKILLs the job's whole
process group. A parent-death signal (``PR_SET_PDEATHSIG``) alone would kill the job and orphan its
children, and a group killed by its owner (``launch.Process.stop``) needs the owner alive; the lease
covers both. A child the owner forks without exec (a multiprocessing worker) closes the write end at
once, so that it cannot keep the lease alive after the owner. The job is not asked to stop gracefully: its owner is gone, and the run resumes from
its last checkpoint as after any preemption without notice.

:func:`die_with_parent` is the parent-death signal for a single program that holds no lease (Prism).
:func:`run_step` runs one ``rlax`` command as such a job to its end, its progress logged, failing
loudly (``rlax quickstart``'s steps, ``rlax launch``'s stages).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

log = logging.getLogger(__name__)

LEASE_ENV = "RLAX_LIFELINE_FD"  # the fd number of the lease's read end, in a job started by spawn()

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1
_lease: tuple[int, int, int] | None = None  # (owner pid, read end, write end)


def _lease_fds() -> tuple[int, int]:
    """This process's lease pipe, made once (again in a forked child: the parent's belongs to the parent)."""
    global _lease
    if _lease is None or _lease[0] != os.getpid():
        read_end, write_end = os.pipe()  # both not inheritable; spawn passes the read end alone
        _lease = (os.getpid(), read_end, write_end)
    return _lease[1], _lease[2]


def _drop_inherited_lease() -> None:
    """In a child forked without exec (a multiprocessing worker): close the owner's write end, which
    would otherwise keep the lease alive after the owner died."""
    global _lease
    if _lease is not None and _lease[0] != os.getpid():
        for fd in _lease[1:]:
            try:
                os.close(fd)
            except OSError:
                pass
        _lease = None


os.register_at_fork(after_in_child=_drop_inherited_lease)


def spawn(command: Sequence[str], *, stdout=None, stderr=None, cwd=None, env: Mapping[str, str] | None = None,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """``command`` in its own session, holding this process's lease (and ``pass_fds``, e.g. a run
    folder's lock, so that the folder stays held while any job of the run lives)."""
    read_end, _ = _lease_fds()
    environment = {**(os.environ if env is None else env), LEASE_ENV: str(read_end)}
    return subprocess.Popen(list(command), stdout=stdout, stderr=stderr, cwd=cwd, env=environment,
                            start_new_session=True, pass_fds=(read_end, *pass_fds))


def cli_command(argv: Sequence[str]) -> list[str]:
    """``rlax ARGV`` as this interpreter runs it: ``python -m pipelines.cli ARGV``."""
    return [sys.executable, "-m", "pipelines.cli", *argv]


def spawn_job(command: Sequence[str], log_path: Path, *, append: bool = False) -> subprocess.Popen:
    """``command`` (e.g. :func:`cli_command`) as a job this process owns (:func:`spawn`): the one way a
    launcher (``rlax launch``, ``rlax quickstart``) starts a job. It runs in the caller's folder, so
    relative paths mean the same to the job, with the package importable from wherever it lives (a
    checkout or site-packages); it holds the run folders this process holds
    (``run_folder.held_fds``); its output goes to ``log_path`` (appended to with ``append``). It runs with ``RLAX_DEBUG``
    set: its log keeps the traceback above the one line a launcher reads back (``pipelines.failures``)."""
    from pipelines.failures import child_env
    from pipelines.run_folder import held_fds

    package_root = str(Path(__file__).resolve().parents[1])
    env = {**child_env(), "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    log.info("starting %s", " ".join(command))
    with open(log_path, "ab" if append else "wb") as handle:
        return spawn(command, stdout=handle, stderr=subprocess.STDOUT, env=env, pass_fds=held_fds())


def hold() -> bool:
    """In a job started by :func:`spawn`: kill this process group when the owner's lease ends.

    Returns whether there was a lease to hold. The variable is removed from the environment so that
    the job's own children (which do not inherit the fd) never take an unrelated fd for a lease.
    """
    value = os.environ.pop(LEASE_ENV, None)
    if value is None or not value.isdigit():
        return False
    fd = int(value)
    try:
        os.fstat(fd)
    except OSError:
        return False  # started by hand with a stale variable: there is no lease to hold
    leader = os.getpgrp() == os.getpid()

    def watch() -> None:
        while True:
            try:
                if os.read(fd, 1) == b"":
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        # The owner is gone. Not a log line first: logging may be locked by a thread that never returns.
        os.write(2, f"rlax: the process that started this job (lease fd {fd}) is gone; stopping\n".encode())
        if leader:
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="rlax-lease", daemon=True).start()
    return True


def die_with_parent(parent_pid: int):
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it dies. Linux only; the
    libc handle is loaded beforehand, so the forked child takes no lock."""

    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


PROGRESS_EVERY_S = 15.0  # how often a running step reports


def run_step(argv: list[str], log_path: Path, timeout_s: float = 1800, prompts: int | None = None,
             who: str = "quickstart") -> None:
    """Run ``rlax ARGV`` as a job this process owns (each step is the real entry point); fail loudly.
    ``who`` starts its log lines (``rlax quickstart``'s steps, ``rlax launch``'s stages).

    Every ``PROGRESS_EVERY_S`` it logs how long the step has run and, given ``prompts`` (the most the
    step samples), how many prompts the engine has sampled so far, read from the step's own log.
    """
    from pipelines.failures import JobFailed, job_failed

    log.info("%s: %s (log: %s)", who, " ".join(argv[:1] + [a for a in argv[1:] if not a.startswith("/")][:6]),
             log_path)
    started = time.monotonic()
    process = spawn_job(cli_command(argv), log_path)  # owned: the step dies with its launcher, however it dies
    while True:
        try:
            code = process.wait(timeout=PROGRESS_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                os.killpg(process.pid, signal.SIGKILL)  # the step and what it started
                process.wait()
                raise JobFailed(f"the rlax {argv[0]} job did not finish within {timeout_s:.0f} s; its log: {log_path}") from None
            sampled = "" if prompts is None else f", {prompts_sampled(log_path)} of {prompts} prompts sampled"
            log.info("%s: rlax %s running for %.0f s%s", who, argv[0], elapsed, sampled)
    if code != 0:
        raise job_failed(f"rlax {argv[0]}", code, log_path)


# EngineHost.complete (rlax_core.rollout.host) logs one line per engine batch: "MODEL: N prompt(s) x K sample(s), ..."
_SAMPLED_BATCH = re.compile(rb": (\d+) prompt\(s\) x \d+ sample\(s\)")


def prompts_sampled(log_path: Path) -> int:
    return sum(int(n) for n in _SAMPLED_BATCH.findall(log_path.read_bytes()))
