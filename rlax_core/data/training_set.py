"""Training sets read from storage, once per process.

The rollout job's graph carries the training set's path, never its rows: a Dataflow job graph must
not grow with the data (Dataflow refuses graphs above about 10 MB). Each worker process reads the
set on first use and keeps it for every DoFn instance and bundle of that process
(:func:`cached_examples`).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from rlax_core.config import InputError

# What the rollout reads of every training row (rlax_core.data.records' Example schema names them all).
REQUIRED_FIELDS = ("id", "prompt", "task")

_cache: dict[str, tuple[dict[str, Any], ...]] = {}
_cache_lock = threading.Lock()


def read_examples(path: str, required: tuple[str, ...] = REQUIRED_FIELDS, kind: str = "Example") -> list[dict[str, Any]]:
    """Example rows from a parquet file, a folder or glob of parquet shards or a JSON-lines file (local or gs://).

    Rows come back sorted by ``id``: the prompt schedule indexes rows, so their order must not depend
    on how shards were written. Rows without the ``required`` fields (of the Example schema, or another
    ``kind``: the post-training records) raise ``InputError``,
    and so does a folder a batch command did not finish writing (``rlax_core.data.completion``).
    """
    import fsspec
    import pyarrow.parquet as pq

    from rlax_core.data.completion import require_complete

    require_complete(path, "train set")  # the folder of a batch command that did not finish: refused
    if path.endswith(".jsonl"):
        with fsspec.open(path, "r", encoding="utf-8-sig") as handle:  # a byte-order mark is not a row
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        fs, root = fsspec.core.url_to_fs(path)
        if any(c in root for c in "*?["):
            files = sorted(fs.glob(root))
        elif fs.isdir(root):
            files = sorted(fs.glob(f"{root.rstrip('/')}/*.parquet"))
        else:
            files = [root]
        rows = []
        for file in files:
            with fs.open(file, "rb") as handle:
                rows.extend(pq.read_table(handle).to_pylist())
    if not rows:
        raise FileNotFoundError(f"no examples under {path}")
    missing = [name for name in required if name not in rows[0]]
    if missing and kind != "Example":
        raise InputError(f"{path}: not {kind} rows (no {', '.join(missing)}; found {', '.join(sorted(rows[0]))})")
    if missing:
        raise InputError(f"{path}: not Example rows (no {', '.join(missing)}; found {', '.join(sorted(rows[0]))}); "
                         "rows of another layout become Example rows through rlax curate --format NAME")
    return sorted(rows, key=lambda r: r["id"])


def cached_examples(path: str) -> tuple[dict[str, Any], ...]:
    """:func:`read_examples`, read once per process and path and shared by every caller of it."""
    with _cache_lock:  # held while reading: concurrent first callers wait instead of reading twice
        if path not in _cache:
            _cache[path] = tuple(read_examples(path))
        return _cache[path]
