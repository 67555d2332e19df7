"""Leases and collection: which versions may go, and removing them without pulling one from a reader.

A reader writes a lease (``leases/<reader>-step_00000012.json``, with an expiry) before it reads a
version's commit marker, and removes it when done. The collector keeps the newest versions, the ones
superseded less than the grace period ago, the leased ones, and every version those are built on
(delta bases, down to a full version).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Callable, Iterator

from rlax_core.weights import manifest as mf
from rlax_core.weights.errors import WeightStoreError
from rlax_core.weights.manifest import CommitMarker
from rlax_core.utils.storage import Storage


@contextlib.contextmanager
def lease(storage: Storage, reader_id: str, version: int, ttl_s: float) -> Iterator[None]:
    """Pin ``version`` while the block runs; the lease lapses after ``ttl_s`` if the reader crashes."""
    path = f"leases/{reader_id}-{mf.version_dir(version)}.json"
    body = {"version": version, "reader": reader_id, "expires_at": time.time() + ttl_s}
    storage.write(path, json.dumps(body).encode(), atomic=True)
    try:
        yield
    finally:
        storage.delete(path)


def leased_versions(storage: Storage, *, drop_expired: bool = False) -> set[int]:
    pinned, now = set(), time.time()
    for name in storage.list("leases"):
        try:
            body = json.loads(storage.read(f"leases/{name}"))
        except (FileNotFoundError, ValueError):
            continue  # released while we looked, or being written
        if float(body.get("expires_at", 0)) > now:
            pinned.add(int(body["version"]))
        elif drop_expired:
            storage.delete(f"leases/{name}")  # left by a reader that crashed
    return pinned


def collect(storage: Storage, committed: list[int], read_marker: Callable[[int], CommitMarker], keep: int,
            grace_s: float) -> list[int]:
    """Remove what ``WeightStore.gc(keep)`` may remove (see there); returns the versions removed.

    ``committed`` lists the committed versions, oldest first; ``read_marker`` reads one's commit marker.
    """
    if not committed:
        return []
    now, pinned = time.time(), leased_versions(storage, drop_expired=True)
    markers: dict[int, CommitMarker | None] = {}

    def marker_of(version: int) -> CommitMarker | None:
        if version not in markers:
            try:
                markers[version] = read_marker(version)
            except WeightStoreError:
                markers[version] = None
        return markers[version]

    kept = set(committed[-keep:])
    for older, newer in zip(committed[:-keep], committed[1:]):
        superseded = marker_of(newer)
        if older in pinned or superseded is None or now - superseded.committed_at < grace_s:
            kept.add(older)
    kept |= bases_needed(kept, marker_of)
    removed = []
    for older in committed[:-keep]:
        if older in kept:
            continue
        storage.delete(mf.marker_path(older))
        # A reader leases before it reads the marker; one that read the marker just before it went
        # has its lease visible by now, so its files stay until a later gc finds the lease gone.
        if older not in leased_versions(storage):
            storage.delete_tree(mf.version_dir(older))
        removed.append(older)
    newest = committed[-1]
    for name in storage.list(""):
        version = mf.parse_version_name(name)
        if version is not None and version < newest and version not in committed and version not in pinned:
            storage.delete_tree(name)
    return removed


def bases_needed(versions: set[int], marker_of: Callable[[int], CommitMarker | None]) -> set[int]:
    """Every version that ``versions`` are built on: delta bases down to full versions, and the full
    version an adapter-only version applies to."""
    needed, frontier = set(), list(versions)
    while frontier:
        marker = marker_of(frontier.pop())
        for base in () if marker is None else (marker.base, marker.adapter_base):
            if base is not None and base not in needed:
                needed.add(base)
                frontier.append(base)
    return needed
