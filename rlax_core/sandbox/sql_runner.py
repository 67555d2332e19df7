"""Inside a SQL sandbox: run one query on one read-only database and write its rows, or why not, on fd 3.

A standalone script (standard library only) that ``rlax_core/sandbox/sql.py`` ships into a sandbox
with its job in ``job.json``. The query is untrusted text (a policy wrote it); this script is not,
and it shuts every door SQLite has to anything but reading the one database:

* the file opens through a ``file:...?mode=ro&immutable=1`` URI (and the sandbox binds it read-only),
  then ``PRAGMA query_only``; extension loading is never enabled and ``SQLITE_LIMIT_ATTACHED`` is 0;
* an authorizer allows only reading (``SELECT``, reads of the main and temp schemas, recursive CTEs),
  an allow list of pure functions (no ``load_extension``, ``readfile``, ``writefile``, ``edit``,
  ``fts3_tokenizer``) and a few schema-describing pragmas; every other action (``ATTACH``,
  ``DETACH``, writes, DDL, transactions, pragmas that set something) is refused and named;
* a progress handler interrupts the query at its deadline; ``hard_heap_limit`` caps SQLite's memory
  (and ``temp_store=MEMORY`` keeps sorts inside that cap, off the disk); rows stop at the row cap
  plus one; text and blobs are capped by ``SQLITE_LIMIT_LENGTH``.

The sandbox around it (CPU, address space, wall clock, namespaces) stands behind all of that: a crash
or a hang of SQLite itself ends this process, and the caller names it. Output: one JSON object,
``{"ok": true, "columns", "rows", "more"}`` or ``{"ok": false, "reason", "detail"}``.
"""

import json
import os
import sqlite3
import sys
import time
import urllib.parse

RESULT_FD = 3
READ_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list",
                "table_list"}
FUNCTIONS = set("""
abs changes char coalesce format glob hex ifnull iif instr length like likelihood likely lower ltrim max min nullif
printf quote random randomblob replace round rtrim sign soundex substr substring trim typeof unicode unlikely upper
zeroblob avg count group_concat sum total string_agg date time datetime julianday unixepoch strftime timediff
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value acos acosh asin
asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10 log2 mod pi pow power radians sin sinh
sqrt tan tanh trunc json json_array json_array_length json_extract json_insert json_object json_patch json_remove
json_replace json_set json_type json_valid json_quote json_group_array json_group_object json_each json_tree -> ->>
""".split())
# SQLite's authorizer action codes, by number (sqlite3.h), to name what was refused.
ACTION_NAMES = dict(enumerate("""COPY CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER
CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE
DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ SELECT TRANSACTION UPDATE ATTACH DETACH
ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE FUNCTION SAVEPOINT RECURSIVE""".split()))


def _write(record: dict) -> None:
    data = json.dumps(record).encode()
    while data:
        data = data[os.write(RESULT_FD, data):]


def _cell(value):
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    return value


class Guard:
    """The authorizer and the progress handler; remembers the first thing it refused, to name it."""

    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.refused = None
        self.timed_out = False

    def authorize(self, action, arg1, arg2, database, trigger):
        allowed = (action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE)
                   or action == sqlite3.SQLITE_READ  # only the main database exists: ATTACH is refused
                   or (action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in FUNCTIONS)
                   or (action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_PRAGMAS))
        if allowed:
            return sqlite3.SQLITE_OK
        if self.refused is None:
            what = ACTION_NAMES.get(action, str(action))
            self.refused = " ".join(str(part) for part in (what, arg1 if action != sqlite3.SQLITE_FUNCTION else arg2)
                                    if part)
        return sqlite3.SQLITE_DENY

    def progress(self):
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1
        return 0


def _open(job: dict) -> sqlite3.Connection:
    # Inside the sandbox the database is bound at job["database"][0]; without namespaces only the host path exists.
    path = next((p for p in job["database"] if os.path.exists(p)), None)
    if path is None:
        raise FileNotFoundError("the database is not in the sandbox")
    # Quoted: a '?' or '#' in a host path would end the URI's path part.
    connection = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro&immutable=1", uri=True, isolation_level=None,
                                 check_same_thread=False)
    connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, job["max_value_bytes"])
    connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, job["max_query_bytes"])
    for pragma in (f"hard_heap_limit={int(job['heap_bytes'])}", f"soft_heap_limit={int(job['heap_bytes'])}",
                   "temp_store=MEMORY", "query_only=1", "trusted_schema=0"):
        connection.execute(f"PRAGMA {pragma}")
    return connection


def _classify(error: Exception, guard: Guard) -> tuple:
    message = str(error)
    if guard.timed_out or "interrupted" in message:
        return "timeout", f"the query ran past its deadline of {guard.deadline_s:g} s"
    if guard.refused is not None or "not authorized" in message or "prohibited" in message:
        return "refused", f"not allowed: {guard.refused or message}"
    if isinstance(error, MemoryError) or "out of memory" in message:
        return "memory", "the query ran out of its memory cap"
    if "syntax error" in message or "incomplete input" in message:
        return "syntax_error", message
    if "too big" in message or "too long" in message:
        return "too_large", message
    return "error", f"{type(error).__name__}: {message}"


def main() -> None:
    with open("job.json", encoding="utf-8") as handle:
        job = json.load(handle)
    try:
        connection = _open(job)
    except Exception as error:  # noqa: BLE001 - the trusted setup failed: the caller reports the database
        _write({"ok": False, "reason": "database_error", "detail": f"{type(error).__name__}: {error}"})
        return
    start = time.monotonic()
    guard = Guard(job["deadline_s"])
    connection.set_authorizer(guard.authorize)
    connection.set_progress_handler(guard.progress, job["progress_steps"])
    try:
        cursor = connection.execute(job["sql"])
        rows = cursor.fetchmany(job["max_rows"] + 1)
        columns = [d[0] for d in cursor.description or ()]
    except Exception as error:  # noqa: BLE001 - every failure of the query is its verdict
        reason, detail = _classify(error, guard)
        _write({"ok": False, "reason": reason, "detail": detail[:400]})
        return
    if cursor.description is None:
        _write({"ok": False, "reason": "no_rows", "detail": "the statement returns no result set"})
        return
    more = len(rows) > job["max_rows"]
    _write({"ok": True, "columns": columns, "rows": [[_cell(v) for v in row] for row in rows[:job["max_rows"]]],
            "more": more, "seconds": round(time.monotonic() - start, 4)})


if __name__ == "__main__":
    sys.setrecursionlimit(1000)
    main()
