"""The math verifier's workers: a warm parent that forks one worker per connection.

``main([CONTROL_FD, MEMORY_BYTES])`` runs in an interpreter that ``rlax_core.rewards.math_verifier``
starts as a plain subprocess (fork and exec: nothing of the caller's
threads, locks or ``__main__`` comes along). It loads math-verify, warms sympy with one comparison,
and then waits on its control socket. For each byte the caller sends there it makes a socket pair,
forks a worker holding one end, and passes the other end back with the worker's pid and a pidfd
of it (SCM_RIGHTS).
The caller kills a worker that overruns its hard limit and asks for another: a fork of this warm,
single-threaded process, ready in milliseconds where a fresh interpreter would import sympy for seconds.

Each worker has its own connection, so a killed one leaves nothing half-read for its successor. It
serves frames (a 4-byte big-endian length, then JSON): a request is a list of comparisons ``[gold,
prediction, soft_seconds, relative_tolerance]``, and each gets its reply frame ``{"reason": ...}`` as
soon as it is decided, so the caller times every comparison on its own. Its address space is limited, so a runaway
simplification ends in ``MemoryError`` there (reply reason ``error``), not in the host's memory.

When the caller goes away (its end of the control socket closes), this process kills its whole
process group, workers included: none outlives its caller.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import struct
import sys

_LENGTH = struct.Struct(">I")
SPAWN = b"+"  # on the control socket: one worker, please
READY = b"ready"  # on the control socket, once math-verify is loaded and warm


def send_frame(conn: socket.socket, payload) -> None:
    data = json.dumps(payload).encode()
    conn.sendall(_LENGTH.pack(len(data)) + data)


def _recv_exactly(conn: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(conn: socket.socket):
    """The next frame's payload; None when the peer closed the connection."""
    header = _recv_exactly(conn, _LENGTH.size)
    if header is None:
        return None
    data = _recv_exactly(conn, _LENGTH.unpack(header)[0])
    if data is None:
        return None
    return json.loads(data)


def _serve(conn: socket.socket, memory_bytes: int) -> None:
    """A worker's life: one comparison per frame until the caller closes the connection."""
    from rlax_core.rewards.math_symbolic import verdict

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    while (batch := recv_frame(conn)) is not None:
        for request in batch:  # one reply each, sent as it is known: the caller times each comparison
            try:
                reply = {"reason": verdict(*request)}
            except Exception as error:  # noqa: BLE001 - MemoryError, a parser's bug: this answer only
                reply = {"reason": "error", "detail": f"{type(error).__name__}: {error}"[:500]}
            send_frame(conn, reply)


def _fork_worker(control: socket.socket, memory_bytes: int) -> None:
    ours, theirs = socket.socketpair()
    try:
        pid = os.fork()
    except OSError as error:  # EAGAIN or ENOMEM on a loaded host: this request fails, the server stays
        ours.close()
        theirs.close()
        socket.send_fds(control, [f"fork failed: {error}".encode()], [])
        return
    if pid == 0:
        status = 1
        try:
            control.close()
            theirs.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _serve(ours, memory_bytes)
            status = 0
        finally:
            os._exit(status)  # never the parent's loop, atexit handlers or buffers
    ours.close()
    # A handle on this very process, taken while it cannot have been reaped and its pid reused: the
    # caller kills through it, so a kill sent after the worker ended cannot reach another process.
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # it ended already (and was reaped), or the kernel has no pidfds: the pid alone
        pidfd = None
    socket.send_fds(control, [str(pid).encode()], [theirs.fileno()] + ([pidfd] if pidfd is not None else []))
    theirs.close()
    if pidfd is not None:
        os.close(pidfd)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: main([CONTROL_FD, MEMORY_BYTES]), CONTROL_FD a Unix socket")
    control = socket.socket(fileno=int(argv[0]))
    control.setblocking(True)  # the file may come O_NONBLOCK from a caller with a default socket timeout
    memory_bytes = int(argv[1])
    from rlax_core.rewards.math_symbolic import verdict

    verdict("3\\sqrt{3}", "\\sqrt{27}", None)  # imports math-verify and warms sympy before any fork
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    control.sendall(READY)
    try:
        while request := control.recv(64):
            for _ in range(request.count(SPAWN)):
                _fork_worker(control, memory_bytes)
    finally:
        if os.getpgid(0) == os.getpid():  # our own group (the verifier starts us in a new session)
            os.killpg(os.getpid(), signal.SIGKILL)  # the caller is gone or done: so are the workers

