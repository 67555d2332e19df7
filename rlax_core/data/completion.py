"""Batch outputs that say they are complete: a folder a batch command wrote is read only once it is.

A batch command (``rlax curate``, ``rlax filter``, ``rlax evaluate``) marks its output folder:

1. :func:`begin_output`: ``_INCOMPLETE`` first (the command and how to run it again), then the
   previous run's completion record, its files (old shards would mix with new ones: a run cut into
   4 shards, then one into 2, leaves ``-of-00004`` files that every ``examples-*`` glob reads) and
   Beam temp folders (``beam-temp-*``) that an interrupted run left are removed;
2. :func:`complete_output`, after the job and its checks succeeded: ``_INCOMPLETE`` removed, then
   ``_SUCCESS`` written, last.

:func:`require_complete` is how every reader of such a folder (the commands' input checks, training
sets) refuses one that is not complete, in one line saying which command to run again: a folder
holding ``_INCOMPLETE``; or, without ``_SUCCESS``, one holding a ``beam-temp-*`` folder or shards
named as the batch commands name them (``examples-00000-of-00004.parquet``: a batch command of an
older rlax, or one killed before this scheme, wrote it). A folder with none of these is someone's
own files and is read as it is.
"""

from __future__ import annotations

import fnmatch
import json
import time
from pathlib import Path
from typing import Sequence

from rlax_core.config import InputError
from rlax_core.utils.paths import is_remote
from rlax_core.utils.storage import FsspecStorage, open_storage

SUCCESS = "_SUCCESS"
INCOMPLETE = "_INCOMPLETE"
BEAM_TEMP = "beam-temp-*"
SHARD_NAMES = ("examples-?????-of-?????.parquet",)  # what only a batch command writes, and a training set is
_GLOB = "*?["


def begin_output(folder: str, command: str, rerun: str, writes: Sequence[str]) -> None:
    """Mark ``folder`` as being written by ``command`` (``rerun``: the command line that runs it
    again) and clear what a previous run left: its record, its files (``writes``: name patterns)
    and Beam temp folders."""
    storage = open_storage(folder)
    record = {"command": command, "rerun": rerun, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    storage.write(INCOMPLETE, json.dumps(record).encode(), atomic=True)
    storage.delete(SUCCESS)
    for name in storage.list(""):
        if fnmatch.fnmatch(name, BEAM_TEMP):
            storage.delete_tree(name)
        elif any(fnmatch.fnmatch(name, pattern) for pattern in writes):
            storage.delete(name)


def complete_output(folder: str, command: str, rerun: str, seconds: float) -> None:
    """``folder`` is complete: the last write of the command that wrote it."""
    storage = open_storage(folder)
    storage.delete(INCOMPLETE)
    record = {"command": command, "rerun": rerun, "seconds": round(seconds, 1),
              "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    storage.write(SUCCESS, json.dumps(record).encode(), atomic=True)


def output_folder(path: str) -> str | None:
    """The folder whose completeness decides whether ``path`` may be read: the folder itself, or the
    one that holds the file or the glob's files; None for a dataset name (``hf:``)."""
    if path.startswith("hf:"):
        return None
    cut = min((path.index(c) for c in _GLOB if c in path), default=None)
    if cut is not None:
        return path[:cut].rsplit("/", 1)[0] if "/" in path[:cut] else "."
    storage_path = path.rstrip("/")
    if _is_folder(storage_path):
        return storage_path
    return storage_path.rsplit("/", 1)[0] if "/" in storage_path else "."


def _same_folder(a: str, b: str) -> bool:
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return Path(a.removeprefix("file://")).resolve() == Path(b.removeprefix("file://")).resolve()


def _is_folder(path: str) -> bool:
    return _names(path) is not None


def _names(folder: str) -> list[str] | None:
    """The names in ``folder`` (local or a URL, listed afresh), or None when it is no folder."""
    if not is_remote(folder):
        local = Path(folder.removeprefix("file://"))
        return sorted(p.name for p in local.iterdir()) if local.is_dir() else None
    storage = FsspecStorage(folder)
    return storage.list("") if storage.fs.isdir(storage.url) else None


def incomplete_reason(folder: str) -> str | None:
    """Why ``folder`` is not a complete batch output, or None when it may be read."""
    names = _names(folder)
    if names is None:
        return None
    if INCOMPLETE in names:
        try:
            record = json.loads(open_storage(folder).read(INCOMPLETE))
            return (f"{record['command']} started writing it at {record['started']} and did not finish "
                    f"(interrupted, or it failed); run it again: {record['rerun']}")
        except (ValueError, KeyError, TypeError, OSError):
            return "a batch command started writing it and did not finish; run that command again"
    if SUCCESS in names:
        return None
    temp = [n for n in names if fnmatch.fnmatch(n, BEAM_TEMP)]
    if temp:
        return (f"a Beam job left {temp[0]} in it and no {SUCCESS}: it did not finish; run the command that wrote "
                "it again (rlax curate, rlax filter or rlax evaluate)")
    shards = [n for n in names if any(fnmatch.fnmatch(n, p) for p in SHARD_NAMES)]
    if shards:
        return (f"it holds {shards[0]} but no {SUCCESS}: the batch command that wrote it did not finish, or an "
                "older rlax wrote it; run that command again (rlax curate or rlax filter)")
    return None


def require_complete(path: str, what: str, rewriting: str | None = None) -> None:
    """``InputError`` in one line when ``path`` lies in a batch output folder that is not complete;
    not asked of ``rewriting``, the folder the command that reads ``path`` is about to write (its
    own run, done again, reads there)."""
    folder = output_folder(path)
    if folder is None or (rewriting is not None and _same_folder(folder, rewriting)):
        return
    reason = incomplete_reason(folder)
    if reason is not None:
        raise InputError(f"{what} {path}: {folder} is not a complete output: {reason}")
