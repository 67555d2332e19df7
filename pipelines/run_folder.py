"""A run folder belongs to one run: checked before any heavy import, refused when another run is in it.

``rlax quickstart --output DIR`` and ``rlax launch`` (its ``run.output_dir``) start a run in a folder.
A folder that already holds files is another run's (or something else's): starting there would mix
the new run's shards, checkpoints and metrics with the old ones, so it is refused unless the user asks
to continue that run (``--resume``). A folder that cannot be created or written is reported at once,
not after a minute of imports.

A run also holds its folder while it lives: an exclusive ``flock`` on ``DIR/.rlax-lock``, which names
the owner (pid, host, command, start time). The launcher passes the lock to its jobs
(``pipelines.lifeline.spawn``), so the folder stays held while any process of the run is alive; a
second run, ``--resume`` included, is refused with the owner named. The kernel drops the lock when
the last holder dies, so a lock file left by a dead owner is taken over (and said so), never
mistaken for a live run. When the owner has died but its jobs still hold the lock, they are given
``DYING_JOBS_GRACE_S`` to die by their lease before the folder is refused. Remote folders
(``gs://``...) are checked when first written and not locked.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from rlax_core.config import ConfigError
from rlax_core.utils.paths import is_remote

log = logging.getLogger(__name__)

LOCK_NAME = ".rlax-lock"
# The run's upcycled policy (model.upcycle; pipelines.initial_policy), made from the config alone and
# refused there when it was made with other settings: a folder holding only it holds no run yet (the
# quickstart writes it before it launches the run).
UPCYCLED_MODEL = "upcycled_model"
# A dead owner's jobs die by their lease (pipelines.lifeline) moments after it: a restart that comes
# sooner (a supervisor relaunching a killed run at once) waits for them instead of being refused.
DYING_JOBS_GRACE_S = 5.0
_held: dict[str, int] = {}  # resolved folder -> the locked fd, for as long as this process lives


def claim(path: str | Path, *, resume: bool, flag: str = "--output") -> bool:
    """Make ``path`` ready for a run and hold it; returns True when it continues a run already there.

    Raises ``ConfigError`` (one line, naming ``flag``) when the folder is unusable, is held by a live
    run (its pid and host named), or holds files and ``resume`` is false.
    """
    if is_remote(str(path)):
        return resume
    folder = Path(path).expanduser()
    writable(folder, flag)
    held_before = str(folder.resolve()) in _held
    lock(folder, flag)
    used = sorted(p.name for p in folder.iterdir() if p.name not in (LOCK_NAME, UPCYCLED_MODEL))
    if used and not resume:
        if not held_before:
            release(folder)
        raise ConfigError(flag, f"{folder} already holds a run ({', '.join(used[:5])}); "
                                "choose another folder, or pass --resume to continue that run")
    return bool(used)


def lock(folder: Path, flag: str = "--output") -> int:
    """Hold ``folder`` for this process (and the jobs it passes the fd to); returns the locked fd."""
    key = str(folder.resolve())
    if key in _held:
        return _held[key]
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    if not _locked_within(fd, 0.0):
        owner = _read_owner(fd)
        owner_exited = owner.get("host") == socket.gethostname() and not _alive(owner.get("pid"))
        if not (owner_exited and _locked_within(fd, DYING_JOBS_GRACE_S)):
            os.close(fd)
            described = _describe(owner)
            if owner_exited:
                described += f"; pid {owner.get('pid')} has exited, but a process it started still holds the folder"
            raise ConfigError(flag, f"{folder} is in use by a live run: {described}; stop it (or wait for it to "
                                    "end) before starting or resuming a run there")
    previous = _read_owner(fd)
    if previous:
        log.warning("taking over %s from %s, which is no longer running", folder, _describe(previous))
    command = next((word for word in sys.argv[1:] if not word.startswith("-")), "")
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "command": f"rlax {command}" if command.isidentifier() else "rlax"}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(owner).encode(), 0)
    _held[key] = fd
    return fd


def release(folder: str | Path) -> None:
    """Let go of a folder this process holds (a process that ends lets go of its folders anyway)."""
    fd = _held.pop(str(Path(folder).expanduser().resolve()), None)
    if fd is not None:
        os.close(fd)


def held_fds() -> list[int]:
    """The locks this process holds, to pass to the jobs it starts."""
    return list(_held.values())


def _locked_within(fd: int, timeout_s: float) -> bool:
    """Whether this process gets the exclusive lock on ``fd`` within ``timeout_s`` (0: now or never)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _read_owner(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}


def _describe(owner: dict) -> str:
    if not owner:
        return "an unnamed process (no owner written yet)"
    return (f"pid {owner.get('pid')} on host {owner.get('host')} ({owner.get('command', 'rlax')}, "
            f"since {owner.get('since', '?')})")


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def writable(path: str | Path, flag: str = "--output") -> None:
    """Create the local folder ``path`` if needed and check that files can be written in it."""
    if is_remote(str(path)):
        return
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(flag, f"{folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise ConfigError(flag, f"cannot write to {folder}: {error.strerror or error}") from None
