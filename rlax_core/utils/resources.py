"""Resource failures that name themselves: a full disk or an exhausted quota, the path and the process, in one line.

A full disk surfaces deep inside a library (Beam wraps a worker's ``OSError`` in its own error,
orbax and tensorstore in theirs), so the failure a user sees says "exited with code 1" or shows a
traceback of something unrelated. :func:`resource_failure` finds the resource error anywhere in an
exception's chain, or in its text where a wrapper kept only that; :func:`resource_failure_in_log`
finds it in a job's log, for the launcher that started the job.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Sequence

from rlax_core.utils.paths import is_remote

# errno -> how it reads; what a disk or a quota running out raises
RESOURCE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_TEXTS = {os.strerror(number): number for number in RESOURCE_ERRNOS}
# "[Errno 28] No space left on device: '/path'" as Python writes an OSError, wherever it was re-wrapped
_WRITTEN = re.compile(r"\[Errno (?P<errno>\d+)\] (?P<text>[^:'\"\n]+)(?::\s*'(?P<path>[^']+)')?")
# the line pipelines.cli prints for one, so a launcher reads its job's own words back
LINE_MARK = "resource error: "


class ResourceError(OSError):
    """A resource failure already told in one line (a job's, read back from its log by its launcher)."""


def describe(number: int, path: str | None, process: str) -> str:
    name = errno.errorcode.get(number, str(number))
    where = f" writing {path}" if path else ""
    return f"{RESOURCE_ERRNOS[number]} ({name}){where}, in {process} (pid {os.getpid()})"


def resource_failure(error: BaseException, process: str, where: Sequence[str] = ()) -> str | None:
    """One line naming the resource failure behind ``error`` (its cause and context chain, or its
    text), or None when it is not one. When the error does not say which file it was writing (a
    runner may pass on only its text), the first of ``where`` whose file system is full is named."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ResourceError):
            return str(current)
        if isinstance(current, OSError) and current.errno in RESOURCE_ERRNOS:
            return describe(current.errno, current.filename or _file_being_written(current) or full_path(where),
                            process)
        found = _in_text(str(current))
        if found:
            number, path = found
            return describe(number, path or full_path(where), process)
        current = current.__cause__ or current.__context__
    return None


def _file_being_written(error: BaseException) -> str | None:
    """The file a failed write was writing: Python names the file of a failed ``open`` but not of a
    failed ``write``, so look for the open file in the failing frames, innermost first."""
    frames = []
    traceback = error.__traceback__
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            name = getattr(value, "name", None)
            if isinstance(name, str) and hasattr(value, "write") and os.path.isabs(name):
                return name
    return None


def resource_failure_in_log(text: str, where: Sequence[str] = ()) -> str | None:
    """The resource failure a job's log tells of: the job's own one line when it wrote one, else the
    last line that quotes one; without a path in it, the first of ``where`` that is full is named."""
    lines = text.splitlines()
    told = next((line.split(LINE_MARK, 1)[1].strip() for line in reversed(lines) if LINE_MARK in line), None)
    if told is not None:
        full = None if " writing " in told else full_path(where)
        return told.replace(", in ", f" under {full}, in ", 1) if full else told
    for line in reversed(lines):
        found = _in_text(line)
        if found:
            number, path = found
            path = path or full_path(where)
            return f"{RESOURCE_ERRNOS[number]} ({errno.errorcode[number]})" + (f" writing {path}" if path else "")
    return None


FULL_BELOW_BYTES = 1 << 20  # a file system with less free space than this is full for a run


def full_path(paths: Sequence[str]) -> str | None:
    """The first local path of ``paths`` whose file system has (almost) no free space left, with what is left."""
    for path in paths:
        if is_remote(path):
            continue  # a bucket: no file system here to ask
        existing = os.path.abspath(str(path).removeprefix("file://"))
        while not os.path.exists(existing) and existing != os.path.dirname(existing):
            existing = os.path.dirname(existing)
        try:
            stats = os.statvfs(existing)
        except OSError:
            continue
        free = stats.f_bavail * stats.f_frsize
        if free < FULL_BELOW_BYTES:
            return f"{path} ({free:,} bytes free)"
    return None


def _in_text(text: str) -> tuple[int, str | None] | None:
    for match in _WRITTEN.finditer(text):
        if int(match.group("errno")) in RESOURCE_ERRNOS:
            return int(match.group("errno")), match.group("path")
    for message, number in _TEXTS.items():
        if message in text:
            return number, None
    return None
