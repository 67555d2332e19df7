"""The text-to-SQL task: how a database's schema is written into a prompt, and the prompt itself.

An Example of task ``sql`` holds the question in ``prompt``, the gold query in ``answer`` and, in
``meta``, its database (``database``, ``db_sha256``, ``db_id``), its difficulty ``level`` and the
schema as text (``schema``, written once at curation by :func:`serialize_schema`). The prompt format
(``tasks.prompts``: ``sql``) puts the schema before the question and asks for one query in a ```sql
block, the block the ``sql`` reward runs (``rewards.sql_match.extract_sql``).

The schema reads as SQLite DDL, which code models have seen most: each table's columns with their
types, primary and foreign keys, then optionally its first rows as a comment::

    CREATE TABLE orders (
      id INTEGER PRIMARY KEY,
      customer_id INTEGER REFERENCES customers(id),
      quantity INTEGER
    );
    /* 2 rows of orders: id | customer_id | quantity
    1 | 4 | 2
    2 | 1 | 5 */

The schema is read in this process (read-only, ``immutable``), not in the sandbox: a database is the
data set's, chosen by the user, while a query is the policy's; only queries run sandboxed.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

TASK = "sql"
SQL_INSTRUCTION = ("\nWrite one SQLite query that answers the question. Put the final query in a single ```sql "
                   "code block.")
MAX_CELL_CHARS = 40  # a sample row's long text is cut: the prompt shows shapes, not documents


def _quote(name: str) -> str:
    return name if name.replace("_", "").isalnum() and not name[:1].isdigit() else '"' + name.replace('"', '""') + '"'


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "..."


def serialize_schema(database: str | Path, sample_rows: int = 0) -> str:
    """The database's tables as DDL (columns, types, keys), each with its first ``sample_rows`` rows."""
    connection = sqlite3.connect(f"file:{urllib.parse.quote(str(Path(database).resolve()))}?mode=ro&immutable=1",
                                 uri=True)
    try:
        tables = [row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
        parts = []
        for table in tables:
            columns = connection.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
            foreign = {row[3]: (row[2], row[4]) for row in connection.execute(f"PRAGMA foreign_key_list({_quote(table)})")}
            keys = [c for c in columns if c[5]]
            lines = []
            for _, name, kind, notnull, _, pk in columns:
                line = f"  {_quote(name)} {kind or 'ANY'}".rstrip() + (" NOT NULL" if notnull and not pk else "")
                if pk and len(keys) == 1:
                    line += " PRIMARY KEY"
                if name in foreign:
                    other, other_column = foreign[name]
                    line += f" REFERENCES {_quote(other)}({_quote(other_column or 'rowid')})"
                lines.append(line)
            if len(keys) > 1:
                ordered = sorted(keys, key=lambda c: c[5])
                lines.append(f"  PRIMARY KEY ({', '.join(_quote(c[1]) for c in ordered)})")
            text = f"CREATE TABLE {_quote(table)} (\n" + ",\n".join(lines) + "\n);"
            if sample_rows > 0:
                rows = connection.execute(f"SELECT * FROM {_quote(table)} LIMIT {int(sample_rows)}").fetchall()
                header = " | ".join(c[1] for c in columns)
                body = "\n".join(" | ".join(_cell(v) for v in row) for row in rows)
                text += f"\n/* {len(rows)} rows of {table}: {header}\n{body} */"
            parts.append(text)
        return "\n\n".join(parts)
    finally:
        connection.close()


def sql_prompt_body(example: Mapping[str, Any]) -> str:
    """The schema (``meta.schema``, else read from the example's database), then the question."""
    from rlax_core.data.sql_databases import example_database, sql_meta

    schema = sql_meta(example).get("schema") or serialize_schema(example_database(example))
    return f"Database schema:\n{schema}\n\nQuestion: {example['prompt']}"
