"""Refusal reports and repair: how a version damaged after its commit heals without stopping the loop.

A reader that refuses a committed version (a tensor file corrupted or lost after the commit) writes
a report, ``refusals/step_00000012-<reader>.json``, and keeps (or falls back to) its last good version.
The trainer, which still holds that version's parameters, reads the reports while it waits for
rollouts, rewrites every shard whose bytes no longer match the manifest (byte for byte what it
published: the manifest and its checksums do not change, so the version stays immutable) and removes
the reports. A reader retries a version it refused once its own report is gone.

Without this, a damaged version stalls a synchronous run (k = 0): the rollouts of step t must come
from version t, and the trainer cannot publish t + 1 before it trains step t.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from rlax_core.weights import manifest as mf
from rlax_core.utils.dtypes import dtype as dtype_of
from rlax_core.weights.arrays import slices_of
from rlax_core.weights.errors import IntegrityError, WeightStoreError
from rlax_core.weights.shard_io import read_shard
from rlax_core.weights.tree import flatten_params

if TYPE_CHECKING:
    from rlax_core.weights.store import WeightStore

log = logging.getLogger(__name__)

REFUSALS = "refusals"


def _report_path(reader_id: str, version: int) -> str:
    return f"{REFUSALS}/{mf.version_dir(version)}-{reader_id}.json"


def report_refusal(store: "WeightStore", version: int, reason: str) -> None:
    """Tell the writer that this reader refused ``version`` (and why)."""
    body = {"version": version, "reader": store.reader_id, "reason": reason, "at": time.time()}
    store.storage.write(_report_path(store.reader_id, version), json.dumps(body).encode(), atomic=True)


def refusal_reported(store: "WeightStore", version: int) -> bool:
    """Whether this reader's report on ``version`` is still there (gone: the writer repaired it)."""
    return store.storage.exists(_report_path(store.reader_id, version))


def refused_versions(store: "WeightStore") -> dict[int, list[str]]:
    """Committed or not, every version some reader reported refused -> the report files' names."""
    found: dict[int, list[str]] = {}
    for name in store.storage.list(REFUSALS):
        version = mf.parse_version_name(name.split("-", 1)[0])
        if version is not None:
            found.setdefault(version, []).append(name)
    return found


def repair_version(store: "WeightStore", version: int, params: Any) -> list[str]:
    """Rewrite the shards of committed ``version`` that fail verification from ``params`` (the exact
    parameters published as that version), then clear its refusal reports; returns the files rewritten.

    Raises ``IntegrityError`` when ``params`` do not reproduce a damaged shard's checksum (they are not
    that version) or the shard is a delta (its base is not in hand), and ``WeightStoreError`` when the
    version is not committed or its manifest is unreadable: those need the next publish instead.
    """
    manifest = store.manifest(version)
    folder = mf.version_dir(version)
    flat = flatten_params(params)
    rewritten = []
    with store.lease(version):
        for tensor in manifest.tensors:
            dtype = dtype_of(tensor.dtype)
            for shard in tensor.shards:
                path = f"{folder}/{shard.file}"
                if shard.delta is None and _is_intact(store, path, tensor.name, shard, dtype):
                    continue
                if shard.delta is not None:
                    if _delta_is_intact(store, path, shard):
                        continue
                    raise IntegrityError(f"version {version}: {path} is a damaged delta; it cannot be rebuilt "
                                         "without its base, the next full version replaces it")
                if tensor.name not in flat:
                    raise IntegrityError(f"version {version}: no tensor {tensor.name!r} in the params to repair "
                                         f"{path} from")
                values = np.ascontiguousarray(np.asarray(flat[tensor.name])[slices_of(shard.index)]).astype(dtype)
                data = values.tobytes()
                if len(data) != shard.nbytes or xxhash.xxh3_64_hexdigest(data) != shard.checksum:
                    raise IntegrityError(f"version {version}: the params in hand do not reproduce {path} "
                                         f"({tensor.name}); they are not that version")
                store.storage.write(path, data, atomic=True)
                rewritten.append(path)
    for name in refused_versions(store).get(version, []):
        store.storage.delete(f"{REFUSALS}/{name}")
    if rewritten:
        store.count("repaired", version)
        log.warning("weight version %d repaired: rewrote %d damaged shard file(s): %s", version, len(rewritten),
                    ", ".join(rewritten))
    else:
        log.info("weight version %d: refusal reports cleared; every shard verifies", version)
    return rewritten


def _is_intact(store: "WeightStore", path: str, name: str, shard, dtype: np.dtype) -> bool:
    try:
        read_shard(store.storage, path, shard, dtype, None, where=f"{store.storage.url}/{path} ({name})")
    except IntegrityError:
        return False
    return True


def _delta_is_intact(store: "WeightStore", path: str, shard) -> bool:
    try:
        payload = store.storage.read(path)
    except FileNotFoundError:
        return False
    return len(payload) == shard.delta.nbytes and xxhash.xxh3_64_hexdigest(payload) == shard.delta.checksum


def heal_if_refused(store: "WeightStore", version: int, params: Any) -> bool:
    """``repair_version`` when a reader reported ``version`` refused; True when reports were handled.

    Never raises for a version it cannot repair: it logs why and leaves the reports (the next version
    the trainer publishes supersedes it for readers with k >= 1).
    """
    if version not in refused_versions(store):
        return False
    try:
        repair_version(store, version, params)
    except WeightStoreError as error:
        log.error("weight version %d was refused by readers and cannot be repaired: %s", version, error)
        return False
    return True
