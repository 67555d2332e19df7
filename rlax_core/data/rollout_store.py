"""The rollout store: where the rollout fleet leaves rollout groups and the trainer picks them up.

A *group* is the G sampled completions of one prompt at one schedule step. Each group is one parquet
file of ``ROLLOUT_SCHEMA`` rows, named from ``(run, step, prompt_index)`` only::

    ROOT/RUN/step_00000012/group_00003.parquet

so a retried or duplicated write (Beam retries bundles) replaces the same file instead of adding a
second copy. Writes are atomic: a temporary file renamed into place on a local disk, a single-object
upload on GCS (``gs://...`` through fsspec/gcsfs). A reader therefore never sees half a group.

Writer (the streaming rollout pipeline)::

    store = RolloutStore("gs://bucket/rollouts", run="run1")
    key = GroupKey(step=12, prompt_index=3)
    rows = [...]                    # dicts with ROLLOUT_SCHEMA fields, group_id = store.group_id(key)
    store.write_group(key, rows)

Reader (the trainer)::

    keys = store.list_groups()                        # sorted by (step, prompt_index)
    keys = store.wait_for_groups(lambda ks: len(ks) >= 8, timeout_s=600)
    table = store.read_group(key)                     # a pyarrow Table of ROLLOUT_SCHEMA

The rollout side's own files sit beside the groups, under ``ROOT/RUN-metrics/``
(``rlax_core.utils.paths.rollout_metrics_dir``): each step's metrics (``step_00000012.json``,
``write_step_metrics`` / ``read_step_metrics``), the workers' start-up stamps (``startup/``,
``rlax_core.utils.startup``) and their busy notices (``busy/``, ``rlax_core.rollout.busy``).
"""

from __future__ import annotations

import io
import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.utils.paths import rollout_metrics_dir

_GROUP_FILE = re.compile(r"step_(\d{8})/group_(\d{5})\.parquet$")
_MARKER_FILE = re.compile(r"step_(\d{8})/_GENERATED$")


@dataclass(frozen=True, order=True)
class GroupKey:
    """Where a group sits in the prompt schedule; the order of keys is the order of training."""

    step: int
    prompt_index: int

    def __post_init__(self):
        if not (0 <= self.step < 10**8 and 0 <= self.prompt_index < 10**5):
            raise ValueError(f"group key out of range: step {self.step} (0..99999999), "
                             f"prompt_index {self.prompt_index} (0..99999)")

    @property
    def relpath(self) -> str:
        return f"step_{self.step:08d}/group_{self.prompt_index:05d}.parquet"


class RolloutStore:
    """Rollout groups of one run under ``root`` (a local folder or ``gs://bucket/prefix``)."""

    def __init__(self, root: str | os.PathLike, run: str):
        if not run or "/" in run:
            raise ValueError(f"run must be a non-empty name without '/', got {run!r}")
        self.root = str(root).rstrip("/")
        self.run = run
        self._fs, base = fsspec.core.url_to_fs(self.root)
        self._is_local = "file" in _protocols(self._fs)
        self._base = f"{base.rstrip('/')}/{run}"

    def __repr__(self) -> str:
        return f"RolloutStore({self.root!r}, run={self.run!r})"

    # ------------------------------------------------------------------ naming

    def group_id(self, key: GroupKey) -> str:
        """The ``group_id`` field every row of this group carries."""
        return f"{self.run}/{key.step}/{key.prompt_index}"

    def path(self, key: GroupKey) -> str:
        return f"{self._base}/{key.relpath}"

    # ------------------------------------------------------------------ writer

    def write_group(self, key: GroupKey, rows: Sequence[dict[str, Any]] | pa.Table) -> str:
        """Write (or atomically replace) one group; returns its path. Rows must all belong to ``key``."""
        table = rows if isinstance(rows, pa.Table) else to_table(list(rows), ROLLOUT_SCHEMA)
        if table.num_rows == 0:
            raise ValueError(f"group {key} has no rows")
        if not table.schema.equals(ROLLOUT_SCHEMA):
            table = table.select(ROLLOUT_SCHEMA.names).cast(ROLLOUT_SCHEMA)
        expected = self.group_id(key)
        found = set(table.column("group_id").to_pylist())
        if found != {expected}:
            raise ValueError(f"rows of group {key} must carry group_id {expected!r}, found {sorted(found)}")
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        data = buffer.getvalue()
        path = self.path(key)
        if self._is_local:
            # Same folder as the target so that the rename cannot cross file systems.
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        else:
            # One object upload is atomic on GCS: readers see the old object or the new one.
            self._fs.pipe_file(path, data)
        return path

    def mark_step_generated(self, step: int) -> None:
        """Record that schedule step ``step`` is fully generated (idempotent): every prompt slot has
        its group or was dropped on purpose (dynamic sampling), so the step may hold fewer groups."""
        path = self._marker(step)
        if self._is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fs.pipe_file(path, b"")

    def write_dropped_scores(self, key: GroupKey, scores: dict[str, Any]) -> None:
        """What a group dynamic sampling dropped was scored (JSON, idempotent), in its step's folder before
        the step's marker: its scores still count for the curriculum (``rlax_core.rollout.prompt_state``)."""
        path = f"{self._base}/step_{key.step:08d}/dropped_{key.prompt_index:05d}.json"
        if self._is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fs.pipe_file(path, json.dumps(scores, sort_keys=True).encode())

    def read_dropped_scores(self, step: int) -> dict[int, dict[str, Any]]:
        """Per prompt slot, the scores ``write_dropped_scores`` left for ``step``."""
        self._fs.invalidate_cache(f"{self._base}/step_{step:08d}")
        try:
            paths = self._fs.glob(f"{self._base}/step_{step:08d}/dropped_*.json")
        except FileNotFoundError:
            return {}
        return {int(path.rsplit("_", 1)[1].split(".")[0]): json.loads(self._fs.cat_file(path)) for path in paths}

    def write_step_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """The rollout side's metrics of one schedule step, as JSON (rewritten whole: idempotent)."""
        fs, folder = fsspec.core.url_to_fs(rollout_metrics_dir(self.root, self.run))
        fs.makedirs(folder, exist_ok=True)
        fs.pipe_file(f"{folder}/step_{step:08d}.json", json.dumps(metrics, sort_keys=True).encode())

    # ------------------------------------------------------------------ reader

    def read_step_metrics(self) -> list[dict[str, Any]]:
        """Every step's rollout metrics written so far, by step."""
        fs, folder = fsspec.core.url_to_fs(rollout_metrics_dir(self.root, self.run))
        try:
            files = sorted(fs.glob(f"{folder}/step_*.json"))
        except FileNotFoundError:
            return []
        return [json.loads(fs.cat_file(f)) for f in files]

    def is_step_generated(self, step: int) -> bool:
        """Whether ``mark_step_generated(step)`` happened (a step can be complete without it: a
        pipeline killed between its last group and the marker leaves every group but no marker)."""
        return self._fs.exists(self._marker(step))

    def generated_steps(self) -> set[int]:
        """The steps marked generated, from one listing."""
        self._fs.invalidate_cache(self._base)
        try:
            paths = self._fs.glob(f"{self._base}/step_*/_GENERATED")
        except FileNotFoundError:
            return set()
        return {int(match.group(1)) for match in map(_MARKER_FILE.search, paths) if match}

    def is_step_complete(self, step: int, groups_per_step: int, keys: Sequence[GroupKey]) -> bool:
        """Whether schedule step ``step`` is fully generated: all its groups are in ``keys`` (a
        ``list_groups`` listing), or it is marked generated (dynamic sampling may drop groups)."""
        present = sum(key.step == step for key in keys)
        return present >= groups_per_step or self.is_step_generated(step)

    def list_groups(self) -> list[GroupKey]:
        """Every complete group of the run, sorted by (step, prompt_index)."""
        self._fs.invalidate_cache(self._base)
        try:
            paths = self._fs.glob(f"{self._base}/step_*/group_*.parquet")
        except FileNotFoundError:
            return []
        keys = []
        for path in paths:
            match = _GROUP_FILE.search(path)
            if match:
                keys.append(GroupKey(int(match.group(1)), int(match.group(2))))
        return sorted(keys)

    def read_group(self, key: GroupKey) -> pa.Table:
        """The rows of one group, sorted by ``sample_idx``."""
        with self._fs.open(self.path(key), "rb") as handle:
            table = pq.read_table(handle, schema=ROLLOUT_SCHEMA)
        return table.sort_by("sample_idx")

    def wait_for_groups(self, ready: Callable[[list[GroupKey]], bool], *, timeout_s: float,
                        poll_s: float = 0.5, should_stop: Callable[[], bool] | None = None) -> list[GroupKey]:
        """Poll ``list_groups`` until ``ready(keys)``; raise ``TimeoutError`` after ``timeout_s``.

        ``should_stop`` lets a caller end the wait early (a preemption notice): the current listing
        is returned then, ready or not.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            keys = self.list_groups()
            if ready(keys) or (should_stop is not None and should_stop()):
                return keys
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self}: rollout groups not ready after {timeout_s:.0f} s "
                                   f"({len(keys)} groups present, last {keys[-1] if keys else None})")
            time.sleep(poll_s)

    def _marker(self, step: int) -> str:
        return f"{self._base}/step_{step:08d}/_GENERATED"


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
