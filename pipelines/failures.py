"""A failed job reads as its cause: one line naming what failed, why, and where its log is.

``rlax`` ends every failure with one line on stderr (``pipelines.cli``), ``rlax COMMAND: KIND:
MESSAGE``, and no traceback unless ``--debug`` or ``RLAX_DEBUG=1`` asks for it. A command that runs
others (``rlax launch``, ``rlax quickstart``) starts them with ``RLAX_DEBUG=1`` (:func:`child_env`),
so that each child's log keeps its traceback for whoever reads it, followed by its own one line;
when a child fails, :func:`job_failed` reads that line back (:func:`cause_line`): the cause, not
the log's last bytes, which are often the tail of a multi-line message or of a library's dump.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

DEBUG_ENV = "RLAX_DEBUG"

# The line pipelines.cli ends a failure with: "rlax train: input error: no good checkpoint in ..."
_OWN_LINE = re.compile(r"^rlax [a-z]+: (?P<cause>(?:config error|input error|resource error|error|interrupted)\b.*)$")
# An exception as Python's traceback printer ends it: "ValueError: ...", "orbax.x.Error: ...", "KeyboardInterrupt"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(:(\s.*)?)?$")
_MAX_CHARS = 500
LOG_TAIL_BYTES = 4 << 20  # how much of a failed job's log is searched for its cause, from the end


class JobFailed(RuntimeError):
    """A job this command started has failed; its message is the one line that says so."""


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child ``rlax`` job: its log keeps tracebacks before its one line."""
    return {**(os.environ if env is None else env), DEBUG_ENV: "1"}


def cause_line(text: str) -> str | None:
    """Why a job failed, from its log: the job's own one-line failure (the last one), else the
    exception line of the last Python traceback (its message's first line), else None."""
    lines = text.splitlines()
    for line in reversed(lines):
        match = _OWN_LINE.match(line.strip())
        if match:
            return _clip(match.group("cause"))
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Traceback (most recent call last)")),
                 None)
    if start is None:
        return None
    for line in lines[start + 1:]:
        if line and not line[0].isspace() and _EXCEPTION_LINE.match(line):
            return _clip(line.strip())
    return None


def job_failed(name: str, code: int | None, log_path: Path | str, log_text: str | None = None) -> JobFailed:
    """``the trainer job exited with code 1: CAUSE; its log: PATH`` (the cause read from the log)."""
    if log_text is None:
        log_text = _tail(Path(log_path))
    cause = cause_line(log_text) or _last_line(log_text) or "its log says nothing"
    how = f"exited with code {code}" if code is None or code >= 0 else f"was killed by signal {-code}"
    return JobFailed(f"the {name} job {how}: {cause}; its log: {log_path}")


def _tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of a log: where a failure is told (a long run's log may hold gigabytes before it)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - limit))
            data = handle.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if size <= limit else text.split("\n", 1)[-1]  # from the first whole line


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _clip(lines[-1]) if lines else None


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_CHARS else text[:_MAX_CHARS - 3] + "..."
