"""Busy notices of rollout workers, so the stream's driver can tell slow work from a stalled stream.

A worker that starts something long (loading and compiling the engine, an engine call) writes
``ROOT/RUN-metrics/busy/<host:pid>-<thread>.json`` and rewrites it every ``interval_s`` from a
background thread until the work ends, then removes it. ``pipelines.stream_watch`` counts a poll as
idle only when no notice is fresh: on a loaded 2-core machine the first compilation alone took
minutes, which is progress, not a stall. A notice that stops being rewritten (its worker killed)
goes stale after ``fresh_s`` and counts for nothing.
"""

from __future__ import annotations

import json
import threading
import time

import fsspec

from rlax_core.utils.identity import process_identity
from rlax_core.utils.paths import rollout_metrics_dir

INTERVAL_S = 5.0


def _folder(rollout_root: str, run: str) -> str:
    return rollout_metrics_dir(rollout_root, run, "busy")


class Busy:
    """``with Busy(rollout_root, run, "compiling the engine"):`` marks this thread's work as in progress."""

    def __init__(self, rollout_root: str, run: str, what: str, interval_s: float = INTERVAL_S):
        self._fs, folder = fsspec.core.url_to_fs(_folder(rollout_root, run))
        self._folder = folder
        name = f"{process_identity()}-{threading.get_ident()}"
        self._path = f"{folder}/{name}.json"
        self._what, self._interval_s = what, interval_s
        self._since = time.time()
        self._done = threading.Event()

    def _write(self) -> None:
        body = {"what": self._what, "since": self._since, "at": time.time()}
        try:
            self._fs.makedirs(self._folder, exist_ok=True)
            self._fs.pipe_file(self._path, json.dumps(body).encode())
        except OSError:
            pass  # a notice is advice to the driver; failing to write it must not fail the work

    def _renew(self) -> None:
        while not self._done.wait(self._interval_s):
            self._write()

    def __enter__(self) -> "Busy":
        self._write()
        self._thread = threading.Thread(target=self._renew, name="busy-notice", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=self._interval_s + 5)
        try:
            self._fs.rm_file(self._path)
        except (OSError, FileNotFoundError):
            pass


def busy_workers(rollout_root: str, run: str, fresh_s: float = 3 * INTERVAL_S) -> list[dict]:
    """The notices rewritten within ``fresh_s``: work in progress somewhere in the fleet."""
    fs, folder = fsspec.core.url_to_fs(_folder(rollout_root, run))
    try:
        fs.invalidate_cache(folder)
        paths = fs.glob(f"{folder}/*.json")
    except FileNotFoundError:
        return []
    now, fresh = time.time(), []
    for path in paths:
        try:
            body = json.loads(fs.cat_file(path))
        except (OSError, ValueError):
            continue  # removed or half written while we looked
        if now - float(body.get("at", 0)) <= fresh_s:
            fresh.append(body)
    return fresh
