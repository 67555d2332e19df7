"""``WeightStore``: versioned, checksummed, immutable weight versions on a local folder or gs://.

Layout under ``root``::

    step_00000012/manifest.json         tensor index: names, dtypes, shapes, shards, checksums, run id
    step_00000012/t00003-0-0.bin        one file per stored shard (raw bytes, C order)
    step_00000013/t00003-0-0.delta      ... or its delta against the version before (full_snapshot_every > 1)
    step_00000012/part-00001.json       multi-host publish: one partial manifest per host, merged by host 0
    committed/step_00000012.json        the commit marker, written last: a version exists once it does
    leases/<reader>-step_00000012.json  a reader loading that version; the collector leaves it alone

Readers see only committed versions, verify every shard's size and checksum and the manifest's run id
and checksum before any array leaves :meth:`WeightStore.load`, so a half-written, corrupted or foreign
version is refused with a clear error and counted, never used.

Deltas: a version with a ``base`` holds deltas against that version. A reader that holds the base in
memory applies them; one that holds nothing (or something older) reads back along the bases to the
last full version and applies the chain. The collector keeps every base that a kept version needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from typing import Any, Callable, ContextManager, Iterator, Mapping

import numpy as np

from rlax_core.weights import manifest as mf
from rlax_core.utils.dtypes import dtype as dtype_of
from rlax_core.utils.dtypes import is_float
from rlax_core.utils.identity import process_identity
from rlax_core.utils.storage import Storage, open_storage
from rlax_core.weights.arrays import ShardingSpec, assemble, cast, normalize_index, place, slices_of
from rlax_core.weights.collector import collect, lease
from rlax_core.weights.config import WeightStoreConfig
from rlax_core.weights.errors import (
    ForeignRunError,
    IntegrityError,
    ManifestError,
    StorageTimeoutError,
    VersionExistsError,
    VersionNotCommittedError,
    WeightStoreError,
)
from rlax_core.weights.host_parts import merge_parts, part_json, part_path
from rlax_core.weights.manifest import CommitMarker, Manifest, ShardRecord, TensorRecord
from rlax_core.weights.shard_io import read_shard, write_shard
from rlax_core.weights.shard_pool import ShardPool
from rlax_core.weights.tree import flatten_params, unflatten_params

log = logging.getLogger(__name__)

__all__ = ["HeldVersion", "ShardingSpec", "WeightStore"]


@dataclasses.dataclass(frozen=True)
class HeldVersion:
    """A verified version in this process's memory: the in-memory fast path and the base of deltas."""

    version: int
    chain_length: int  # as in its manifest: deltas since the last full version
    arrays: dict[str, np.ndarray]  # whole tensors as stored (the published dtype), read-only


class WeightStore:
    """Publish, find, load and collect weight versions of one run. Thread-safe; one per process is enough."""

    def __init__(self, config: WeightStoreConfig, *, metrics: Any | None = None):
        self.config = config
        self.storage: Storage = open_storage(config.root)
        self.metrics = metrics  # a MetricsWriter (or anything with write(step, scalars)); optional
        self.counters: dict[str, int] = {}
        # A lease's file name holds it (leases/<reader>-step_N.json): no ":" for the folder's sake.
        self.reader_id = f"{process_identity().replace(':', '-')}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._shards = ShardPool(self.storage, config)  # shard reads and writes in flight, each bounded
        # The newest version this process published or loaded, when the config asks to keep one.
        self._held: HeldVersion | None = None

    @property
    def io_threads(self) -> int:
        """Shard reads or writes this store runs at once."""
        return self._shards.threads

    def close(self) -> None:
        """Wait up to ``io_timeout_s`` for shard I/O still running, then stop the I/O threads.

        Raises ``StorageTimeoutError`` when some shard I/O is still stuck then (its thread is left behind).
        """
        self._shards.close()

    def __enter__(self) -> "WeightStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ counters

    def count(self, name: str, version: int | None = None, amount: int = 1) -> None:
        """Add ``amount`` to ``counters[name]`` (and to the store's metrics, at ``version``)."""
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + amount
            value = self.counters[name]
        if self.metrics is not None:
            self.metrics.write(version or 0, {f"weights/{name}": value})

    @property
    def keeps_versions_in_memory(self) -> bool:
        return self.config.in_memory_cache or self.config.full_snapshot_every > 1

    @property
    def held_version(self) -> int | None:
        """The version this process holds in memory (see ``in_memory_cache``, ``full_snapshot_every``)."""
        held = self._held
        return None if held is None else held.version

    def refuse(self, error: WeightStoreError, version: int) -> WeightStoreError:
        """Count and log why ``version`` is refused; returns ``error`` to raise."""
        self.count(f"rejected/{error.reason}", version)
        log.error("weight version %d refused: %s", version, error)
        return error

    # ------------------------------------------------------------------ finding versions

    def versions(self) -> list[int]:
        """Committed versions, oldest first."""
        found = (mf.parse_version_name(name) for name in self.storage.list("committed"))
        return sorted(v for v in found if v is not None)

    def latest(self) -> int | None:
        """The newest committed version, or None when nothing is committed yet."""
        versions = self.versions()
        return versions[-1] if versions else None

    def is_committed(self, version: int) -> bool:
        return self.storage.exists(mf.marker_path(version))

    def watch(self, after: int | None = None, *, timeout_s: float | None = None,
              poll_interval_s: float | None = None) -> Iterator[int]:
        """Yield each newer committed version as it appears (skipping ones superseded in between).

        Raises ``TimeoutError`` when nothing newer than the last yielded version appears within
        ``timeout_s`` (default ``config.watch_timeout_s``): a stalled trainer fails loudly.
        """
        timeout_s = self.config.watch_timeout_s if timeout_s is None else timeout_s
        poll_interval_s = self.config.poll_interval_s if poll_interval_s is None else poll_interval_s
        last, deadline = after, time.monotonic() + timeout_s
        while True:
            newest = self.latest()
            if newest is not None and (last is None or newest > last):
                last = newest
                yield newest
                deadline = time.monotonic() + timeout_s
                continue
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no weight version newer than {last} appeared in {self.storage.url} "
                                   f"within {timeout_s:.0f}s")
            time.sleep(min(poll_interval_s, max(0.0, deadline - time.monotonic())))

    def marker(self, version: int) -> CommitMarker:
        where = f"{self.storage.url}/{mf.marker_path(version)}"
        try:
            data = self.storage.read(mf.marker_path(version))
        except FileNotFoundError:
            raise VersionNotCommittedError(f"version {version} is not committed in {self.storage.url} "
                                           f"(no commit marker {mf.marker_path(version)})") from None
        return CommitMarker.from_json(data, where=where)

    def manifest(self, version: int) -> Manifest:
        """The verified manifest of a committed version of this run."""
        marker = self.marker(version)
        where = f"{self.storage.url}/{mf.version_dir(version)}/manifest.json"
        if marker.run_id != self.config.run_id:
            raise ForeignRunError(f"version {version}: commit marker belongs to run {marker.run_id!r}, "
                                  f"this store follows run {self.config.run_id!r}")
        try:
            data = self.storage.read(f"{mf.version_dir(version)}/manifest.json")
        except FileNotFoundError:
            raise IntegrityError(f"{where}: missing although version {version} is committed") from None
        if mf.checksum(data) != marker.manifest_checksum:
            raise ManifestError(f"{where}: checksum differs from its commit marker (replaced or corrupted)")
        manifest = Manifest.from_json(data, where=where)
        if manifest.run_id != self.config.run_id:
            raise ForeignRunError(f"{where}: manifest of run {manifest.run_id!r}, this store follows run "
                                  f"{self.config.run_id!r}")
        if manifest.version != version:
            raise ManifestError(f"{where}: manifest says version {manifest.version}, expected {version}")
        if manifest.base != marker.base:
            raise ManifestError(f"{where}: manifest's base {manifest.base} differs from its commit marker's {marker.base}")
        for tensor in manifest.tensors:
            itemsize = dtype_of(tensor.dtype).itemsize
            for shard in tensor.shards:
                if shard.nbytes != int(np.prod(shard.shape)) * itemsize:
                    raise ManifestError(f"{where}: shard {shard.file} of {tensor.name} has {shard.nbytes} bytes, "
                                        f"not those of {shard.shape} {tensor.dtype}")
        return manifest

    # ------------------------------------------------------------------ publishing

    def publish(self, version: int, params: Mapping[str, Any], *, process_index: int | None = None,
                process_count: int | None = None, owns_shard: Callable[[Any], bool] | None = None,
                adapter: Mapping[str, Any] | None = None) -> Manifest | None:
        """Write ``params`` as ``version`` and commit it; returns the manifest (None on hosts other than 0).

        Every host calls this with the same version: each writes the shards it holds (replica 0 only,
        so a replicated tensor is written once) and a partial manifest; host 0 waits for all parts,
        writes the manifest and then the commit marker. ``owns_shard`` overrides which shards of a
        ``jax.Array`` this call writes (default: addressable, replica 0).

        With ``full_snapshot_every`` > 1 and one process, the version is written as deltas against the
        version this store published before it, unless a full version is due.

        ``adapter`` marks an adapter-only version (``rlax_core.weights.adapters.publish_adapters`` builds
        it and checks the base it pins); such a version is always written in full.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be an integer >= 0 (the trainer step), got {version!r}")
        if process_index is None or process_count is None:
            import jax

            process_index, process_count = jax.process_index(), jax.process_count()
        if self.is_committed(version):
            raise self.refuse(VersionExistsError(f"version {version} is already committed in {self.storage.url}; "
                                                  "committed versions are immutable"), version)
        started = time.monotonic()
        folder = mf.version_dir(version)
        single_process = process_count == 1
        if single_process:
            self.storage.delete_tree(folder)  # leftovers of a crashed attempt at this version
        # Several hosts would each need the same base in memory and agree on it; they publish in full.
        keep = single_process and self.keeps_versions_in_memory
        base = self._delta_base(version) if single_process and adapter is None else None
        pending = [self._write_tensor(folder, index, name, leaf, process_index, owns_shard, keep, base)
                   for index, (name, leaf) in enumerate(flatten_params(params).items())]
        records, kept = [], {}
        try:
            for record, futures in pending:
                written = self._shards.results(futures, version, record.name, "writes")
                record = dataclasses.replace(record, shards=tuple(shard for shard, _ in written))
                records.append(record)
                if keep:
                    kept[record.name] = assemble(record, {shard.file: values.reshape(shard.shape)
                                                          for shard, values in written})
        except StorageTimeoutError as error:
            raise self.refuse(error, version) from None
        finally:
            for _, futures in pending:  # after a failure, shards still queued are not written
                for future in futures:
                    future.cancel()
        if process_count > 1:
            self.storage.write(part_path(folder, process_index), part_json(records), atomic=True)
            if process_index != 0:
                return None
            records = merge_parts(self.storage, folder, version, process_count, timeout_s=self.config.commit_timeout_s,
                                  poll_interval_s=self.config.poll_interval_s)
        is_delta = any(shard.delta is not None for record in records for shard in record.shards)
        manifest = Manifest(version, self.config.run_id, time.time(), tuple(records),
                            base=base.version if is_delta else None,
                            chain_length=base.chain_length + 1 if is_delta else 0,
                            adapter=None if adapter is None else dict(adapter))
        manifest_bytes = manifest.to_json()
        self.storage.write(f"{folder}/manifest.json", manifest_bytes, atomic=True)
        self.storage.write(mf.marker_path(version), CommitMarker.for_manifest(manifest, manifest_bytes).to_json(),
                           atomic=True)
        if keep:
            self._held = HeldVersion(version, manifest.chain_length, kept)
        self.count("published", version)
        self.count("written_bytes", version, manifest.stored_nbytes)
        log.info("published weight version %d (%.1f MB%s) in %.2fs", version, manifest.nbytes / 1e6,
                 f" as a delta on {manifest.base}: {manifest.stored_nbytes / 1e6:.1f} MB" if is_delta else "",
                 time.monotonic() - started)
        return manifest

    def _delta_base(self, version: int) -> HeldVersion | None:
        """The version to write ``version`` as deltas against, or None when it is written in full."""
        held = self._held
        if (self.config.full_snapshot_every <= 1 or held is None or held.version >= version
                or held.chain_length + 1 >= self.config.full_snapshot_every):
            return None
        # Normally our own previous version; if something collected it, readers could not rebuild ours.
        return held if self.is_committed(held.version) else None

    def _write_tensor(self, folder: str, index: int, name: str, leaf: Any, process_index: int,
                      owns_shard: Callable[[Any], bool] | None, keep: bool, base: HeldVersion | None):
        """Start writing this host's shards of one tensor; returns its record and the shard futures."""
        dtype = self._publish_dtype(leaf.dtype)
        shape = tuple(int(d) for d in leaf.shape)
        pieces: list[tuple[tuple[tuple[int, int], ...], Any]] = []
        if hasattr(leaf, "addressable_shards"):
            owns = owns_shard or (lambda shard: shard.replica_id == 0)
            for shard in leaf.addressable_shards:
                if owns(shard):
                    pieces.append((normalize_index(shard.index, shape), shard.data))
        elif process_index == 0:  # a host (numpy) array: the same on every host, host 0 writes it
            pieces.append((tuple((0, d) for d in shape), leaf))
        base_tensor = None if base is None else base.arrays.get(name)
        if base_tensor is not None and (base_tensor.shape != shape or base_tensor.dtype != dtype):
            base_tensor = None  # a tensor that changed shape or dtype is written in full
        futures = [self._shards.submit(self._write_shard, folder, index, slices, data, dtype, keep,
                                None if base_tensor is None else base_tensor[slices_of(slices)])
                   for slices, data in pieces]
        return TensorRecord(name, dtype.name, shape, ()), futures

    def _write_shard(self, folder: str, index: int, slices, data: Any, dtype: np.dtype, keep: bool,
                     base: np.ndarray | None) -> tuple[ShardRecord, np.ndarray | None]:
        host = np.asarray(data)  # a jax array: the device-to-host transfer, or a read-only view on CPU
        stem = f"t{index:05d}-" + "-".join(str(start) for start, _ in slices) if slices else f"t{index:05d}"
        file = f"{stem}.delta" if base is not None else f"{stem}.bin"
        flat_base = None if base is None else np.ascontiguousarray(base).reshape(-1)
        nbytes, checksum, delta, stored = write_shard(self.storage, f"{folder}/{file}", host, dtype, keep=keep,
                                                      base=flat_base)
        return ShardRecord(file, slices, nbytes, checksum, delta), stored

    def _publish_dtype(self, dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if self.config.publish_dtype and is_float(dtype):
            return dtype_of(self.config.publish_dtype)
        return dtype

    # ------------------------------------------------------------------ loading

    def lease(self, version: int) -> ContextManager[None]:
        """Pin ``version`` against collection while the block runs (lapses after lease_ttl_s if we crash)."""
        return lease(self.storage, self.reader_id, version, self.config.lease_ttl_s)

    def load(self, version: int, *, dtype: Any = None, sharding: ShardingSpec = None,
             as_numpy: bool = False) -> dict[str, Any]:
        """The params of a committed ``version``, verified, cast to ``dtype`` and placed by ``sharding``.

        ``sharding``: a ``jax.sharding.Sharding`` for every tensor, a nested dict of them shaped like
        the params, a function ``name -> Sharding``, or None (the default device). ``as_numpy`` returns
        host arrays instead. Raises a ``WeightStoreError`` (and counts it) for anything but a whole,
        intact version of this run. A version stored as deltas is rebuilt from the version this process
        holds, or from the last full version before it and the deltas after that.
        """
        try:
            with contextlib.ExitStack() as leases:
                manifest, flat = self._read_version(version, leases)
        except WeightStoreError as error:
            raise self.refuse(error, version) from None
        held = self._held
        if self.keeps_versions_in_memory and (held is None or version >= held.version):
            self._held = HeldVersion(version, manifest.chain_length, flat)
        out = {name: cast(array, dtype) for name, array in flat.items()}
        if not as_numpy:
            out = place(out, sharding)
        self.count("loaded", version)
        return unflatten_params(out)

    def _read_version(self, version: int, leases: contextlib.ExitStack) -> tuple[Manifest, dict[str, np.ndarray]]:
        """The manifest and verified host arrays (as stored) of ``version``: from memory, from storage,
        or from a base and the deltas after it. Every version read is leased until ``leases`` closes."""
        manifest, held = self._leased_manifest(version, leases), self._held
        if held is not None and held.version == version:
            return manifest, held.arrays
        deltas = []  # newest first
        step = manifest
        while step.base is not None:
            deltas.append(step)
            if held is not None and held.version == step.base:
                arrays = held.arrays
                break
            try:
                step = self._leased_manifest(step.base, leases)
            except WeightStoreError as error:
                raise type(error)(f"version {version} is built on version {step.base}, which cannot be read: "
                                  f"{error}") from None
        else:
            arrays = self._read_tensors(step, base=None)
            self.count("read_bytes", version, step.stored_nbytes)
        for delta in reversed(deltas):
            arrays = self._read_tensors(delta, base=arrays)
            self.count("read_bytes", version, delta.stored_nbytes)
        return manifest, arrays

    def _leased_manifest(self, version: int, leases: contextlib.ExitStack) -> Manifest:
        # The lease goes first: a collector that deletes the marker after we read it then sees the lease.
        leases.enter_context(self.lease(version))
        return self.manifest(version)

    def _read_tensors(self, manifest: Manifest, base: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """Every tensor of ``manifest``, verified; its delta shards applied to the tensors of ``base``."""
        folder, where = mf.version_dir(manifest.version), f"version {manifest.version}"
        futures = {}
        try:
            for tensor in manifest.tensors:
                dtype = dtype_of(tensor.dtype)
                base_tensor = None if base is None else base.get(tensor.name)
                for shard in tensor.shards:
                    base_values = None
                    if shard.delta is not None:
                        if base_tensor is None or base_tensor.shape != tensor.shape or base_tensor.dtype != dtype:
                            raise ManifestError(f"{where}: {tensor.name} is stored as a delta, but base version "
                                                f"{manifest.base} has no {tensor.dtype} tensor of shape {tensor.shape} "
                                                "by that name")
                        base_values = base_tensor[slices_of(shard.index)]
                    futures[(tensor.name, shard.file)] = self._shards.submit(self._read_shard, folder, tensor, shard,
                                                                      dtype, base_values)
            arrays = {}
            for tensor in manifest.tensors:
                values = self._shards.results([futures[(tensor.name, s.file)] for s in tensor.shards],
                                             manifest.version, tensor.name, "reads")
                arrays[tensor.name] = assemble(tensor, {s.file: v for s, v in zip(tensor.shards, values)}, where=where)
            return arrays
        finally:
            for future in futures.values():
                future.cancel()

    def _read_shard(self, folder: str, tensor: TensorRecord, shard: ShardRecord, dtype: np.dtype,
                    base: np.ndarray | None) -> np.ndarray:
        path = f"{folder}/{shard.file}"
        flat_base = None if base is None else np.ascontiguousarray(base).reshape(-1)
        values = read_shard(self.storage, path, shard, dtype, flat_base, where=f"{self.storage.url}/{path} ({tensor.name})")
        return values.reshape(shard.shape)

    # ------------------------------------------------------------------ collecting

    def gc(self, keep: int | None = None) -> list[int]:
        """Remove old versions; returns those removed.

        Keeps the ``keep`` newest committed versions (default ``config.keep``), any version superseded
        less than ``gc_grace_s`` ago, any version a live lease pins, and every version that one of those
        is built on (its delta base, the base's base, ... down to a full version). The commit marker goes
        first, so a version is invisible before its files go. Uncommitted folders older than the newest
        committed version (crashed or superseded publishes) are removed too.
        """
        keep = self.config.keep if keep is None else keep
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        committed = self.versions()
        removed = collect(self.storage, committed, self.marker, keep, self.config.gc_grace_s)
        if removed:
            self.count("collected", committed[-1], len(removed))
        return removed
