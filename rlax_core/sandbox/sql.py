"""Run an untrusted SQL query on a read-only SQLite database, in the sandbox process, never in the caller.

    outcome = run_query("/data/concert_singer.sqlite", "SELECT count(*) FROM singer", SqlLimits())
    outcome.ok, outcome.rows, outcome.reason      # True, [(6,)], "ok"

Each query gets a sandbox of its own (``run.run_sandboxed``: namespaces, a uid of its own, CPU,
memory and wall-clock limits) that runs ``sql_runner.py``; the database is bound into it read-only
and opened read-only inside (the runner's docstring lists its guards). A query that crashes SQLite,
hangs past the wall clock or is killed fails its own outcome, named (``crashed``, ``timeout``); the
caller's process and its other queries never notice. Rows cross back as JSON and are decoded here
into plain tuples of ``int``, ``float``, ``str``, ``bytes`` and ``None``: nothing else.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import signal
from pathlib import Path
from typing import Any, Iterable

from rlax_core.config import require
from rlax_core.sandbox.run import MIB, SandboxLimits, run_sandboxed

RUNNER = Path(__file__).with_name("sql_runner.py")
INSIDE_DATABASE = "/db/database.sqlite"  # where the sandbox sees the database
# The outcome reasons: ``ok``, then what the query did (``refused``, ``timeout``, ``memory``,
# ``syntax_error``, ``error``, ``too_large``, ``no_rows``), then how the sandbox ended when the runner
# could not say (``crashed``, ``killed``), and ``database_error`` (the database, not the query).
QUERY_REASONS = ("refused", "timeout", "memory", "syntax_error", "error", "too_large", "no_rows", "crashed", "killed")


@dataclasses.dataclass(frozen=True)
class SqlLimits:
    """What one query may use; the sandbox's own limits stand behind SQLite's."""

    deadline_s: float = 5.0  # the progress handler interrupts the query here
    max_rows: int = 10_000  # rows beyond this are not fetched; the outcome says ``more``
    heap_bytes: int = 256 * MIB  # SQLite's hard_heap_limit (its sorts and temp tables included)
    max_value_bytes: int = 1 * MIB  # SQLITE_LIMIT_LENGTH: the longest text or blob a query may build
    max_query_bytes: int = 100_000  # SQLITE_LIMIT_SQL_LENGTH
    result_bytes: int = 16 * MIB  # the rows as JSON; more fails the query as too_large
    progress_steps: int = 1000  # SQLite VM steps between deadline checks
    sandbox: SandboxLimits = dataclasses.field(
        default_factory=lambda: SandboxLimits(cpu_seconds=10, wall_seconds=15.0, memory_bytes=768 * MIB,
                                              file_bytes=1 * MIB, workdir_bytes=4 * MIB, processes=1))

    def __post_init__(self):
        require(self.deadline_s > 0, "deadline_s", "must be > 0")
        require(self.deadline_s < self.sandbox.wall_seconds, "deadline_s",
                "must be below sandbox.wall_seconds (the sandbox's wall clock is the backstop)")
        require(self.max_rows >= 1, "max_rows", "must be >= 1")
        require(self.heap_bytes >= 8 * MIB, "heap_bytes", "must be >= 8 MiB")
        require(self.heap_bytes + 64 * MIB <= self.sandbox.memory_bytes, "heap_bytes",
                "must leave 64 MiB of sandbox.memory_bytes to Python")
        require(self.max_value_bytes >= 1024, "max_value_bytes", "must be >= 1024")
        require(self.max_query_bytes >= 1024, "max_query_bytes", "must be >= 1024")
        require(self.result_bytes >= 64 * 1024, "result_bytes", "must be >= 64 KiB")
        require(self.progress_steps >= 1, "progress_steps", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class SqlOutcome:
    """How one query went: its rows, or the reason it has none (``detail`` says more)."""

    reason: str  # "ok" or one of QUERY_REASONS / "database_error"
    rows: tuple[tuple[Any, ...], ...] = ()
    columns: tuple[str, ...] = ()
    more: bool = False  # the query had rows beyond max_rows (not fetched)
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reason == "ok"

    def info(self) -> dict[str, Any]:
        """JSON-friendly: what a reward's info keeps of it."""
        out: dict[str, Any] = {"reason": self.reason, "rows": len(self.rows)}
        if self.detail:
            out["detail"] = self.detail[:300]
        if self.more:
            out["more"] = True
        return out


class DatabaseError(ValueError):
    """The database itself cannot be queried (missing, unreadable by the sandbox, not SQLite): one line."""


def _plain(value: Any) -> Any:
    """A cell as one of the five SQLite value types, or ValueError (the runner's output is not trusted)."""
    if value is None or type(value) in (int, str):
        return value
    if type(value) is float:
        return value
    if type(value) is dict and set(value) == {"blob"} and type(value["blob"]) is str:
        return bytes.fromhex(value["blob"])
    raise ValueError(f"not a SQLite value: {type(value).__name__}")


def decode_outcome(text: str, max_rows: int) -> SqlOutcome:
    """The runner's JSON as an outcome; anything off-shape is an ``error``, never trusted."""
    try:
        record = json.loads(text)
        if record.get("ok") is True:
            rows = record["rows"]
            if type(rows) is not list or len(rows) > max_rows or not all(type(row) is list for row in rows):
                raise ValueError("rows are not a list of lists")
            columns = tuple(str(c) for c in record.get("columns", ()))
            return SqlOutcome("ok", tuple(tuple(_plain(v) for v in row) for row in rows), columns,
                              bool(record.get("more")), seconds=float(record.get("seconds", 0.0)))
        reason = str(record["reason"])
        if reason not in QUERY_REASONS and reason != "database_error":
            raise ValueError(f"unknown reason {reason[:40]!r}")
        return SqlOutcome(reason, detail=str(record.get("detail", ""))[:400])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return SqlOutcome("error", detail=f"unreadable result: {error}"[:400])


@functools.cache
def _runner_text() -> str:
    return RUNNER.read_text()


def check_readable(database: str | os.PathLike) -> Path:
    """``database`` as an absolute path the sandbox's unprivileged uid can read, or DatabaseError."""
    path = Path(database).resolve()
    if not path.is_file():
        raise DatabaseError(f"database {database} does not exist")
    if not path.stat().st_mode & 0o004:
        raise DatabaseError(f"database {database} is not world-readable (mode {path.stat().st_mode & 0o777:o}): "
                            "the sandbox reads it as an unprivileged user; chmod o+r it")
    with open(path, "rb") as handle:
        if handle.read(16) != b"SQLite format 3\x00":
            raise DatabaseError(f"database {database} is not a SQLite 3 file")
    return path


def run_query(database: str | os.PathLike, sql: str, limits: SqlLimits = SqlLimits()) -> SqlOutcome:
    """Run ``sql`` on ``database`` (a local SQLite file) in a sandbox of its own; never raises for the query.

    Raises :class:`DatabaseError` when the database cannot be queried at all, and
    ``run.SandboxUnavailable`` when no sandbox can start.
    """
    path = check_readable(database)
    job = {"database": [INSIDE_DATABASE, str(path)], "sql": sql, "deadline_s": limits.deadline_s,
           "max_rows": limits.max_rows, "heap_bytes": limits.heap_bytes, "max_value_bytes": limits.max_value_bytes,
           "max_query_bytes": limits.max_query_bytes, "progress_steps": limits.progress_steps}
    report = run_sandboxed({"sql_runner.py": _runner_text(), "job.json": json.dumps(job)}, ["sql_runner.py"],
                           limits.sandbox, results_bytes=limits.result_bytes,
                           readonly_files={INSIDE_DATABASE: str(path)})
    if "results" in report.overflowed:
        return SqlOutcome("too_large", detail=f"the result is over {limits.result_bytes} bytes",
                          seconds=report.wall_seconds)
    if report.results.strip():
        outcome = decode_outcome(report.results, limits.max_rows)
        if outcome.reason == "database_error":
            raise DatabaseError(f"database {database} cannot be opened: {outcome.detail}")
        return outcome if outcome.seconds else dataclasses.replace(outcome, seconds=report.wall_seconds)
    # No verdict from the runner: the sandbox ended it. Say how.
    if report.timed_out:
        return SqlOutcome("timeout", detail=f"killed at the sandbox's wall-clock limit of "
                          f"{limits.sandbox.wall_seconds:g} s", seconds=report.wall_seconds)
    if report.signal is not None:
        name = signal.Signals(report.signal).name
        if report.signal in (signal.SIGXCPU, signal.SIGKILL) and report.cpu_seconds >= limits.sandbox.cpu_seconds:
            return SqlOutcome("timeout", detail=f"the sandbox's SQLite process died of {name} at its CPU-time limit "
                              f"of {limits.sandbox.cpu_seconds} s", seconds=report.wall_seconds)
        return SqlOutcome("crashed", detail=f"the sandbox's SQLite process died of {name}", seconds=report.wall_seconds)
    tail = (report.stderr.strip().splitlines() or [""])[-1]
    reason = "memory" if "MemoryError" in tail else "crashed"
    return SqlOutcome(reason, detail=f"exit code {report.exit_code}: {tail[-300:]}", seconds=report.wall_seconds)


class SqlRunner:
    """A pool of sandboxed queries (threads: each waits on its own sandbox process)."""

    def __init__(self, workers: int = 2, limits: SqlLimits = SqlLimits()):
        require(workers >= 1, "workers", "must be >= 1")
        self.limits = limits
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sql-sandbox")

    def submit(self, database: str | os.PathLike, sql: str) -> concurrent.futures.Future:
        return self._pool.submit(run_query, database, sql, self.limits)

    def run_many(self, items: Iterable[tuple[str, str]]) -> list[SqlOutcome]:
        return [future.result() for future in [self.submit(*item) for item in items]]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
