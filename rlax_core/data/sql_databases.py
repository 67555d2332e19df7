"""Where a SQL example's database is: a local file, or an object in storage fetched once into a local cache.

An Example of task ``sql`` names its database in ``meta``: ``database`` (a local path, or a URL such
as ``gs://bucket/spider/database/x/x.sqlite``) and ``db_sha256`` (its checksum at curation). Workers
read it from storage themselves, once per machine, into ``cache_dir/<sha256>.sqlite``: a database
never travels through the job graph, and a copy that does not match its checksum is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Mapping

from rlax_core.sandbox.sql import DatabaseError
from rlax_core.utils.paths import is_remote

DEFAULT_CACHE = "~/.cache/rlax/sql"
_checksums: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def database_checksum(path: str | os.PathLike) -> str:
    """The sha256 of a local database file, computed once per (file, size, modification time)."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _lock:
        if key in _checksums:
            return _checksums[key]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    with _lock:
        _checksums[key] = digest.hexdigest()
    return _checksums[key]


def sql_meta(example: Mapping[str, Any]) -> dict[str, Any]:
    """The example's ``meta`` as a dict (it travels JSON-encoded)."""
    meta = example.get("meta") or {}
    if isinstance(meta, str):
        meta = json.loads(meta or "{}")
    if not isinstance(meta, dict):
        raise ValueError(f"example {example.get('id', '?')!r}: meta is not an object")
    return meta


def _fetch(url: str, expected: str | None, cache_dir: Path) -> Path:
    from rlax_core.utils.storage import open_storage

    folder, _, name = url.rstrip("/").rpartition("/")
    key = expected or hashlib.sha256(url.encode()).hexdigest()
    target = cache_dir / f"{key}.sqlite"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cache_dir / f".{key}.{uuid.uuid4().hex}.partial"
    try:
        with open_storage(folder).reader(name) as (_, source), open(partial, "wb") as sink:
            for chunk in iter(lambda: source.read(1 << 20), b""):
                sink.write(chunk)
    except FileNotFoundError:
        partial.unlink(missing_ok=True)
        raise DatabaseError(f"database {url} does not exist") from None
    os.chmod(partial, 0o644)  # the sandbox reads it as an unprivileged user
    os.replace(partial, target)  # atomic: a reader never sees half a database
    return target


def local_database(location: str, expected_sha256: str | None = None, cache_dir: str = DEFAULT_CACHE) -> Path:
    """A local path to the database at ``location``, checked against ``expected_sha256`` when given.

    Raises :class:`DatabaseError` (one line) for a missing database or a checksum that does not match.
    """
    if not location:
        raise DatabaseError("the example names no database (meta.database)")
    if is_remote(location):
        path = _fetch(location, expected_sha256, Path(cache_dir).expanduser())
    else:
        path = Path(location.removeprefix("file://")).expanduser()
        if not path.is_file():
            raise DatabaseError(f"database {location} does not exist")
    if expected_sha256 and database_checksum(path) != expected_sha256:
        raise DatabaseError(f"database {location} has changed since curation (sha256 {database_checksum(path)[:12]}, "
                            f"expected {expected_sha256[:12]})")
    return path


def example_database(example: Mapping[str, Any], cache_dir: str = DEFAULT_CACHE) -> Path:
    """The local database of a ``sql`` example (``meta.database``, checked against ``meta.db_sha256``)."""
    meta = sql_meta(example)
    return local_database(str(meta.get("database") or ""), meta.get("db_sha256"), cache_dir)
