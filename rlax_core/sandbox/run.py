"""Run untrusted Python in a sandboxed child process: limits first, then isolation.

:func:`run_sandboxed` hands a job to ``rlax_core/sandbox/launcher.py`` (a standard-library-only script run once
per process with ``python -I -S``, as root: a zygote that forks a handler per sandbox), which builds
the sandbox and enforces the wall-clock limit; this side adds a second, outer timeout that kills the
handler's whole process group, so no program can hold a caller.
See the launcher's docstring for what the sandbox contains.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import marshal
import os
import random
import select
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from rlax_core.config import require

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launcher.py")
# Each run gets a uid of its own from this range (unused by real accounts): its process-count limit
# is then its own, and no two sandboxes can signal each other.
SANDBOX_UID_BASE, SANDBOX_UID_COUNT = 1 << 20, 1 << 20
# The launcher kills the program at its wall limit; this margin covers the launcher's own start.
OUTER_TIMEOUT_MARGIN_S = 10.0
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one sandboxed program may use."""

    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_bytes: int = 1024 * MIB  # address space (RLIMIT_AS) of each process
    file_bytes: int = 16 * MIB  # largest file it may write (RLIMIT_FSIZE)
    workdir_bytes: int = 64 * MIB  # its tmpfs working directory, all files together
    processes: int = 4  # RLIMIT_NPROC for its own uid: the program and up to 3 children or threads
    open_files: int = 64
    output_bytes: int = 64 * 1024  # stdout, stderr and the verdict channel are each cut here
    isolate: bool = True  # namespaces + chroot; False only for debugging on a trusted program

    def __post_init__(self):
        require(self.cpu_seconds >= 1, "cpu_seconds", "must be >= 1")
        require(self.wall_seconds > 0, "wall_seconds", "must be > 0")
        require(self.memory_bytes >= 64 * MIB, "memory_bytes", "must be >= 64 MiB (Python itself needs ~30 MiB)")
        require(self.file_bytes >= 0, "file_bytes", "must be >= 0")
        require(self.workdir_bytes >= MIB, "workdir_bytes", "must be >= 1 MiB")
        require(self.processes >= 1, "processes", "must be >= 1")
        require(self.open_files >= 8, "open_files", "must be >= 8")
        require(self.output_bytes >= 1024, "output_bytes", "must be >= 1024")


class SandboxUnavailable(RuntimeError):
    """The sandbox could not be built or its launcher failed: no program ran (a scorer that needs it
    cannot work at all: ``rewards.registry.SCORER_UNAVAILABLE``).

    Decided from the launcher's own signals (its exit status, the setup channel that closes as the
    program starts), never from what the program wrote or how it exited.
    """


@dataclasses.dataclass(frozen=True)
class SandboxReport:
    """How a sandboxed program ended, and what it wrote (each stream cut at ``output_bytes``)."""

    exit_code: int | None  # None when killed by a signal
    signal: int | None
    timed_out: bool  # the wall-clock limit killed it
    wall_seconds: float
    cpu_seconds: float
    stdout: str
    stderr: str
    results: str  # the verdict channel (fd 3)
    uid: int  # the run's own uid: no process of it outlives the run
    isolated: bool
    isolation_missing: str = ""  # why not isolated, when not
    stopped: bool = False  # its lifeline closed (the peer it served was done), and then it ended or was killed
    overflowed: tuple[str, ...] = ()  # the streams cut at their cap ("stdout", "stderr", "results")
    # Why the sandbox could not be built, from a channel that closes as the program starts (empty: it was)
    setup_error: str = ""

    @property
    def setup_failed(self) -> bool:
        return bool(self.setup_error)


@functools.cache
def _python_and_mounts() -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The interpreter to run, the directories to bind read-only, and the symlinks leading to them."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    files = [python, *_shared_libraries(python)]
    dynload = Path(sysconfig.get_path("platstdlib")) / "lib-dynload"
    for extension in sorted(dynload.glob("*.so")) if dynload.is_dir() else []:
        files += _shared_libraries(str(extension))
    directories = {os.path.realpath(sys.base_prefix)}
    symlinks: dict[str, str] = {}
    for file in files:
        directories.add(os.path.dirname(_walk_symlinks(file, symlinks)))
    # Keep only the outermost of nested directories; bind mounts are recursive.
    outermost = sorted(d for d in directories if not any(d != o and d.startswith(o + "/") for o in directories))
    return python, tuple(outermost), tuple(sorted(symlinks.items()))


def _shared_libraries(binary: str) -> list[str]:
    """Shared libraries a binary loads (``ldd``), including the dynamic loader."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    libraries = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) > parts.index("=>") + 1 and parts[parts.index("=>") + 1].startswith("/"):
            libraries.append(parts[parts.index("=>") + 1])
        elif parts and parts[0].startswith("/"):
            libraries.append(parts[0])
    return libraries


def _walk_symlinks(path: str, symlinks: dict[str, str]) -> str:
    """Resolve ``path`` component by component, recording each symlink met; return the real path."""
    resolved = "/"
    pending = [p for p in path.split("/") if p]
    for _ in range(256):  # bounded: a symlink loop cannot spin forever
        if not pending:
            return resolved
        candidate = os.path.join(resolved, pending.pop(0))
        if os.path.islink(candidate):
            target = os.readlink(candidate)
            symlinks[candidate] = target
            base = "/" if target.startswith("/") else resolved
            pending = [p for p in os.path.join(base, target).split("/") if p] + pending
            resolved = "/"
        else:
            resolved = candidate
    raise OSError(f"too many symlinks resolving {path}")


_warned_isolation = False


def launcher_process() -> subprocess.Popen:
    """This process's sandbox launcher (the zygote), started if it is not running: a caller that
    watches its health, or a test that kills it to see the next sandbox start it again."""
    return _Launcher.get(_python_and_mounts()[0]).process


class _Launcher:
    """The zygote: one ``launcher.py --serve`` per process, forking a handler per sandbox.

    It starts on first use (and again if it died, or in a forked child of this process), and ends
    when this process closes its end of the socket. Each job travels as fds on that socket: the read
    end of a pipe the job is written to, the write end of the reply pipe, and the fds it hands on.
    """

    _lock = threading.Lock()
    _current: "_Launcher | None" = None

    def __init__(self, python: str):
        # cwd "/": it outlives the caller's working folder (a test's or job's temporary one may be deleted).
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Blocking whatever socket.getdefaulttimeout() is (Beam's GCS credentials set it to 60 s for the
        # whole process): a socket made under a default timeout is O_NONBLOCK, a flag of the open file
        # that the server would inherit, and its first recv with nothing queued would end it (EAGAIN).
        ours.setblocking(True)
        theirs.setblocking(True)
        self.process = subprocess.Popen([python, "-I", "-S", "-B", str(LAUNCHER), "--serve", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), env={}, start_new_session=True, cwd="/",
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.socket, self.owner = ours, os.getpid()

    @classmethod
    def get(cls, python: str) -> "_Launcher":
        with cls._lock:
            current = cls._current
            if current is None or current.owner != os.getpid() or not current.alive():
                if current is None:
                    atexit.register(cls._close_current)
                cls._current = current = cls(python)
            return current

    def alive(self) -> bool:
        """Running, and its end of the socket open: the server never writes to it, so anything to read
        (end of file) or a hang-up means it is gone, even before its exit status is there to poll."""
        if self.process.poll() is not None:
            return False
        poller = select.poll()
        poller.register(self.socket, select.POLLIN | select.POLLHUP | select.POLLERR)
        return not poller.poll(0)

    @classmethod
    def _close_current(cls) -> None:
        if cls._current is not None and cls._current.owner == os.getpid():
            cls._current.socket.close()  # the server sees end-of-file and exits

    def run(self, job: bytes, handed: list[int], timeout: float) -> dict:
        """Hand the job to a new handler and wait for its report; ``handed`` fds are closed here."""
        job_read, job_write = os.pipe()
        reply_read, reply_write = os.pipe()
        try:
            socket.send_fds(self.socket, [b"job"], [job_read, reply_write, *handed])
        except OSError as error:
            for fd in (job_write, reply_read):
                os.close(fd)
            raise SandboxUnavailable(f"the sandbox launcher (pid {self.process.pid}, exit code "
                                     f"{self.process.poll()}) takes no jobs: {error}") from None
        finally:
            # The handler has its own copies now; one here would hide the peer's end-of-file.
            for fd in (job_read, reply_write, *handed):
                os.close(fd)
            handed.clear()
        try:
            with open(job_write, "wb") as sink:
                sink.write(job)
        except BrokenPipeError:
            pass  # the handler died before reading it: its reply says so
        return read_reply(reply_read, timeout)


def read_reply(fd: int, timeout: float) -> dict:
    """The handler's report from the reply pipe ``fd`` (closed here), within ``timeout``.

    The handler writes its pid on the first line, then its report; past the deadline its process
    group is killed (``TimeoutError``), and a handler that never wrote its pid raises
    ``SandboxUnavailable``."""
    deadline, data = time.monotonic() + timeout, bytearray()
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                handler = data.split(b"\n", 1)[0]
                if handler.isdigit():
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(int(handler), signal.SIGKILL)  # its sandbox dies with it (parent-death signal)
                    raise TimeoutError(f"sandbox launcher did not return within {timeout:.0f} s")
                raise SandboxUnavailable(f"the sandbox launcher did not start a handler within {timeout:.0f} s")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(fd)
    _, _, body = bytes(data).partition(b"\n")
    try:
        reply = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        raise SandboxUnavailable("sandbox launcher failed: its handler ended without a report") from None
    if "report" not in reply:
        raise SandboxUnavailable(f"sandbox launcher failed: {reply.get('error', '?')}")
    return reply["report"]


def run_sandboxed(files: Mapping[str, str], argv: Sequence[str], limits: SandboxLimits = SandboxLimits(),
                  env: Mapping[str, str] | None = None, channels: Mapping[int, int] | None = None,
                  uid: int | None = None, lifeline: int | None = None, results_bytes: int | None = None,
                  readonly_files: Mapping[str, str] | None = None) -> SandboxReport:
    """Write ``files`` into a fresh sandbox directory and run ``python -I -S -B *argv`` there.

    ``channels`` maps an fd number in the program (above 3) to an fd of this process (a pipe end) that
    the program gets there; they are handed over: this function closes its copies once the launcher
    holds them. ``uid``: the run's own uid (default: a random one from the sandbox range), for a caller
    that runs two sandboxes side by side and needs them apart. ``lifeline``: the read end of a pipe,
    handed over the same way, that the program does not get: once every copy of its write end is
    closed, the program has a second to end, then it is killed (the report says ``stopped``).
    ``results_bytes``: the cap of the results channel (fd 3) when it is not ``limits.output_bytes``.
    ``readonly_files``: path inside the sandbox -> a host file bound there read-only (when isolated;
    without namespaces the program must use the host path).

    Raises :class:`SandboxUnavailable` when no program could run (the sandbox could not be built, or
    the launcher failed); everything the program does ends in the report instead.
    """
    channels = _checked_channels(channels)
    owned = [*channels.values(), *([lifeline] if lifeline is not None else [])]
    try:
        return _run_launcher(files, argv, limits, env, channels, uid, lifeline, None, owned, results_bytes,
                             readonly_files)
    finally:
        for fd in owned:
            os.close(fd)


def _checked_channels(channels: Mapping[int, int] | None) -> dict[int, int]:
    channels = dict(channels or {})
    if any(target <= 3 for target in channels):
        for fd in channels.values():
            os.close(fd)  # handed over, as documented, even when refused
        raise ValueError(f"channel fds must be above 3 (0-3 are stdin, stdout, stderr, results): {sorted(channels)}")
    return channels


class StaleSandbox(RuntimeError):
    """A prepared sandbox that ended before its job came (its idle time ran out): prepare another."""


class PreparedSandbox:
    """A sandbox started ahead of its job, its interpreter up and waiting: ``start`` gives it the job.

    Like :func:`run_sandboxed`, but the program's stdin is a pipe that ``start`` writes (then closes)
    and its wall clock starts only then; until then it may wait ``idle_seconds``. A pool of these hides
    the start of a sandbox's interpreter from the checks that use it (``code_verifier.CodeVerifier``).
    """

    def __init__(self, files: Mapping[str, str], argv: Sequence[str], limits: SandboxLimits = SandboxLimits(),
                 env: Mapping[str, str] | None = None, channels: Mapping[int, int] | None = None,
                 uid: int | None = None, lifeline: int | None = None, idle_seconds: float = 300.0):
        channels = _checked_channels(channels)
        stdin_read, self._stdin = os.pipe()
        start_read, self._start = os.pipe()
        channels[0] = stdin_read
        owned = [*channels.values(), *([lifeline] if lifeline is not None else []), start_read]
        self._report: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                self._report.set_result(_run_launcher(files, argv, limits, env, channels, uid, lifeline,
                                                      (start_read, idle_seconds), owned, None))
            except BaseException as error:  # noqa: BLE001 - the waiting caller gets it from report()
                self._report.set_exception(error)
            finally:
                for fd in owned:
                    os.close(fd)

        threading.Thread(target=run, name="sandbox-prepared", daemon=True).start()

    @property
    def waiting(self) -> bool:
        """Still up and waiting for its job (not ended, not started)."""
        return not self._report.done() and self._start is not None

    def start(self, stdin: bytes, results_bytes: int | None = None) -> None:
        """Give the program its input now (``results_bytes``: the results channel's cap, as in run_sandboxed)."""
        try:
            with open(self._start, "wb") as go:
                self._start = None
                go.write(marshal.dumps({"results_bytes": results_bytes}))
            with open(self._stdin, "wb") as sink:
                self._stdin = None
                sink.write(stdin)
        except BrokenPipeError:
            self.cancel()
            # It ended: because it could not be built (that SandboxUnavailable goes up), or it idled out.
            with contextlib.suppress(concurrent.futures.TimeoutError):
                self._report.result(timeout=OUTER_TIMEOUT_MARGIN_S)
            raise StaleSandbox("the prepared sandbox ended before its job came") from None

    def report(self) -> SandboxReport:
        """How it ended (waits for it); raises what :func:`run_sandboxed` would."""
        return self._report.result()

    def cancel(self) -> None:
        """Give it up unstarted: its program is killed without running a job."""
        for name in ("_start", "_stdin"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)


def _run_launcher(files: Mapping[str, str], argv: Sequence[str], limits: SandboxLimits,
                  env: Mapping[str, str] | None, channels: dict[int, int], uid: int | None,
                  lifeline: int | None, deferred: tuple[int, float] | None, owned: list[int],
                  results_bytes: int | None, readonly_files: Mapping[str, str] | None = None) -> SandboxReport:
    """``deferred``: (the read end of the start pipe, the idle limit) for a prepared sandbox."""
    global _warned_isolation
    python, readonly_dirs, symlinks = _python_and_mounts()
    job = {
        "files": dict(files),
        "argv": list(argv),
        "python": python,
        "readonly_dirs": list(readonly_dirs),
        "symlinks": [list(pair) for pair in symlinks],
        "readonly_files": [[inside, os.path.realpath(host)] for inside, host in (readonly_files or {}).items()],
        "limits": dataclasses.asdict(limits),
        "isolate": limits.isolate,
        "uid": SANDBOX_UID_BASE + random.randrange(SANDBOX_UID_COUNT) if uid is None else uid,
        # By position among the fds handed to the launcher (``owned``): channels, the lifeline, the start pipe.
        "channels": [[target, position] for position, target in enumerate(channels)],
        "lifeline": None if lifeline is None else len(channels),
        "start": None if deferred is None else len(owned) - 1,
        "idle_seconds": None if deferred is None else deferred[1],
        "results_bytes": results_bytes,
        "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0",
                **(env or {})},
    }
    timeout = limits.wall_seconds + OUTER_TIMEOUT_MARGIN_S + (deferred[1] if deferred else 0.0)
    fields = _Launcher.get(python).run(marshal.dumps(job), owned, timeout)
    report = SandboxReport(**{**fields, "overflowed": tuple(fields.get("overflowed", ()))})
    if not report.isolated and limits.isolate and not _warned_isolation:
        _warned_isolation = True
        log.warning("SANDBOX NOT ISOLATED: %s. Untrusted code runs with resource limits only: it can use the "
                    "network and read files this user can read.", report.isolation_missing)
    if report.setup_failed:
        raise SandboxUnavailable(report.setup_error)
    return report
