"""Spider and BIRD rows as Examples of task ``sql``: the question, the gold SQL and the database it runs on.

A Spider-format input is a JSON (or JSON Lines) file of questions and a folder of SQLite databases
(``InputSpec.databases``, local or gs://), each at ``<folder>/<db_id>/<db_id>.sqlite`` (Spider, BIRD)
or ``<folder>/<db_id>.sqlite``. Fields read:

* the question: ``question`` (BIRD's ``evidence``, when present, follows it as a hint);
* the gold SQL: ``query`` (Spider) or ``SQL`` (BIRD);
* ``db_id``; the difficulty: ``difficulty`` (BIRD, the shipped task) or ``hardness`` -> ``meta.level``.

Each row is checked before it is kept, and dead-lettered with its reason otherwise:
``missing_gold_sql`` (no query), ``missing_database`` (no file for its ``db_id``), ``gold_sql_fails``
(the gold query does not run on its own database in the SQL sandbox, or returns no result set).
The example records the database's location and checksum (``meta.database``, ``meta.db_sha256``),
never its bytes: workers read it from storage (``sql_databases``). The schema text of the prompt
(``tasks.sql.serialize_schema``, with ``InputSpec.schema_rows`` rows of each table) is written into
``meta.schema`` once per database.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Mapping

from rlax_core.data.format_error import FormatError
from rlax_core.data.records import make_example
from rlax_core.data.sql_databases import DEFAULT_CACHE, database_checksum, local_database
from rlax_core.sandbox.sql import DatabaseError, SqlLimits, run_query
from rlax_core.tasks.sql import TASK, serialize_schema
from rlax_core.utils.paths import is_remote, join

SQL_FORMATS = ("spider", "bird")
_lock = threading.Lock()


def _exists(location: str) -> bool:
    if is_remote(location):
        from rlax_core.utils.storage import open_storage

        folder, _, name = location.rpartition("/")
        return open_storage(folder).exists(name)
    from pathlib import Path

    return Path(location).is_file()


@functools.lru_cache(maxsize=1024)
def _database(databases: str, db_id: str, cache_dir: str, schema_rows: int) -> tuple[str, str, str]:
    """(location, sha256, schema text) of one database, found and read once per process."""
    candidates = [join(databases, db_id, f"{db_id}.sqlite"), join(databases, f"{db_id}.sqlite")]
    location = next((c for c in candidates if _exists(c)), None)
    if location is None:
        raise FormatError("missing_database", f"no database for db_id {db_id!r}: looked for {' and '.join(candidates)}")
    if not is_remote(location):
        from pathlib import Path

        location = str(Path(location).resolve())  # workers read it from where the example says, not from their cwd
    try:
        path = local_database(location, cache_dir=cache_dir)
    except DatabaseError as error:
        raise FormatError("missing_database", str(error)) from None
    return location, database_checksum(path), serialize_schema(path, schema_rows)


def _text(raw: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        value = raw.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _prompt(raw: Mapping[str, Any]) -> str:
    question = _text(raw, "question")
    if question is None:
        raise FormatError("missing_field", "field 'question' is missing or empty")
    evidence = _text(raw, "evidence")
    return f"{question}\nHint: {evidence}" if evidence else question


def sql_question(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    """The question alone, unchecked: an evaluation set read for decontamination needs no database."""
    return make_example(source=source, split=split, prompt=_prompt(raw), task=TASK, answer=_text(raw, "query", "SQL"),
                        meta={"db_id": raw.get("db_id")})


def sql_example(raw: Mapping[str, Any], source: str, split: str | None, databases: str | None,
                schema_rows: int = 0, limits: SqlLimits = SqlLimits(), cache_dir: str = DEFAULT_CACHE) -> dict[str, Any]:
    """A Spider / BIRD row as a checked Example (module docstring); FormatError names what is wrong.

    ``schema_rows``: the first rows of each table shown under its DDL in the prompt's schema.
    """
    if not databases:
        raise FormatError("missing_database", "a spider / bird input needs its folder of databases (inputs[].databases)")
    prompt = _prompt(raw)
    gold = _text(raw, "query", "SQL", "sql")
    if gold is None:
        raise FormatError("missing_gold_sql", "the row has no gold SQL (field 'query', or BIRD's 'SQL')")
    db_id = _text(raw, "db_id")
    if db_id is None or "/" in db_id or db_id.startswith("."):
        raise FormatError("missing_database", f"field 'db_id' is missing or not a plain name: {raw.get('db_id')!r}")
    location, sha256, schema = _database(databases.rstrip("/"), db_id, cache_dir, schema_rows)
    outcome = run_query(local_database(location, sha256, cache_dir), gold, limits)
    if outcome.ok and outcome.more:
        raise FormatError("gold_sql_fails", f"the gold SQL returns more than {limits.max_rows} rows on database "
                          f"{db_id!r} (the row cap): no answer could match it")
    if not outcome.ok:
        raise FormatError("gold_sql_fails", f"the gold SQL fails on database {db_id!r}: {outcome.reason}: "
                          f"{outcome.detail}"[:400])
    level = raw.get("difficulty", raw.get("hardness"))
    meta = {"db_id": db_id, "database": location, "db_sha256": sha256, "schema": schema,
            "level": str(level) if level is not None else None}
    for key in ("question_id", "id"):
        if raw.get(key) is not None:
            meta["original_id"] = raw[key]
    return make_example(source=source, split=split, prompt=prompt, task=TASK, answer=gold, meta=meta)
