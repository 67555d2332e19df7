"""``WeightStore``: versioned, checksummed, immutable weight versions on a local folder or gs://.

Layout under ``root``::

    step_00000012/manifest.json         tensor index: names, dtypes, shapes, shards, checksums, run id
    step_00000012/t00003-0-0.bin        one file per stored shard (raw bytes, C order)
    step_00000012/part-00001.json       multi-host publish: one partial manifest per host, merged by host 0
    committed/step_00000012.json        the commit marker, written last: a version exists once it does
    leases/<reader>-step_00000012.json  a reader loading that version; the collector leaves it alone

Readers see only committed versions, verify every shard's size and checksum and the manifest's run id
and checksum before any array leaves :meth:`WeightStore.load`, so a half-written, corrupted or foreign
version is refused with a clear error and counted, never used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from rlax_core.weights import manifest as mf
from rlax_core.weights.config import WeightStoreConfig
from rlax_core.weights.errors import (
    ForeignRunError,
    IntegrityError,
    ManifestError,
    VersionExistsError,
    VersionNotCommittedError,
    WeightStoreError,
)
from rlax_core.weights.manifest import CommitMarker, Manifest, ShardRecord, TensorRecord
from rlax_core.weights.storage import FsspecStorage, Storage, open_storage
from rlax_core.weights.tree import flatten_params, unflatten_params

log = logging.getLogger(__name__)

# Sharding for load(): one for every tensor, a nested dict like the params, or a function of the name.
ShardingSpec = Any


class WeightStore:
    """Publish, find, load and collect weight versions of one run. Thread-safe; one per process is enough."""

    def __init__(self, config: WeightStoreConfig, *, metrics: Any | None = None):
        self.config = config
        self.storage: Storage = open_storage(config.root)
        self.metrics = metrics  # a MetricsWriter (or anything with write(step, scalars)); optional
        self.counters: dict[str, int] = {}
        self.reader_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        # Object stores are latency-bound and gain from many requests in flight; a local disk is
        # bandwidth-bound, and more writers than cores only contend (measured: 8 threads on 2 cores
        # wrote 1 GB 2-3x slower than 1 or 2).
        threads = config.io_threads if isinstance(self.storage, FsspecStorage) else min(config.io_threads, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="weights-io")
        # The in-memory fast path: the newest version this process published, as verified host arrays.
        self._recent: tuple[int, dict[str, np.ndarray]] | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "WeightStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ counters

    def _count(self, name: str, version: int | None = None, amount: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + amount
            value = self.counters[name]
        if self.metrics is not None:
            self.metrics.write(version or 0, {f"weights/{name}": value})

    def _refuse(self, error: WeightStoreError, version: int) -> WeightStoreError:
        self._count(f"rejected/{error.reason}", version)
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
        return manifest

    # ------------------------------------------------------------------ publishing

    def publish(self, version: int, params: Mapping[str, Any], *, process_index: int | None = None,
                process_count: int | None = None,
                owns_shard: Callable[[Any], bool] | None = None) -> Manifest | None:
        """Write ``params`` as ``version`` and commit it; returns the manifest (None on hosts other than 0).

        Every host calls this with the same version: each writes the shards it holds (replica 0 only,
        so a replicated tensor is written once) and a partial manifest; host 0 waits for all parts,
        writes the manifest and then the commit marker. ``owns_shard`` overrides which shards of a
        ``jax.Array`` this call writes (default: addressable, replica 0).
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be an integer >= 0 (the trainer step), got {version!r}")
        if process_index is None or process_count is None:
            import jax

            process_index, process_count = jax.process_index(), jax.process_count()
        if self.is_committed(version):
            raise self._refuse(VersionExistsError(f"version {version} is already committed in {self.storage.url}; "
                                                  "committed versions are immutable"), version)
        started = time.monotonic()
        folder = mf.version_dir(version)
        if process_count == 1:
            self.storage.delete_tree(folder)  # leftovers of a crashed attempt at this version
        pending = [self._write_tensor(folder, index, name, leaf, process_index, owns_shard)
                   for index, (name, leaf) in enumerate(flatten_params(params).items())]
        records, host_arrays = [], {}
        for record, futures in pending:
            written = [future.result() for future in futures]
            record = TensorRecord(record.name, record.dtype, record.shape, tuple(shard for shard, _ in written))
            records.append(record)
            if self.config.in_memory_cache and process_count == 1:
                host_arrays[record.name] = _assemble(record, {shard.file: array for shard, array in written})
        if process_count > 1:
            self.storage.write(f"{folder}/part-{process_index:05d}.json", _part_json(records), atomic=True)
            if process_index != 0:
                return None
            records = self._merge_parts(folder, version, process_count)
        manifest = Manifest(version, self.config.run_id, time.time(), tuple(records))
        manifest_bytes = manifest.to_json()
        self.storage.write(f"{folder}/manifest.json", manifest_bytes, atomic=True)
        self.storage.write(mf.marker_path(version), CommitMarker.for_manifest(manifest, manifest_bytes).to_json(),
                           atomic=True)
        if host_arrays:
            self._recent = (version, host_arrays)
        self._count("published", version)
        log.info("published weight version %d (%.1f MB) in %.2fs", version, manifest.nbytes / 1e6,
                 time.monotonic() - started)
        return manifest

    def _write_tensor(self, folder: str, index: int, name: str, leaf: Any, process_index: int,
                      owns_shard: Callable[[Any], bool] | None):
        """Start writing this host's shards of one tensor; returns its record and the shard futures."""
        dtype = self._publish_dtype(leaf.dtype)
        shape = tuple(int(d) for d in leaf.shape)
        pieces: list[tuple[tuple[tuple[int, int], ...], Any]] = []
        if hasattr(leaf, "addressable_shards"):
            owns = owns_shard or (lambda shard: shard.replica_id == 0)
            for shard in leaf.addressable_shards:
                if owns(shard):
                    pieces.append((_normalize_index(shard.index, shape), shard.data))
        elif process_index == 0:  # a host (numpy) array: the same on every host, host 0 writes it
            pieces.append((tuple((0, d) for d in shape), leaf))
        futures = [self._pool.submit(self._write_shard, folder, index, slices, data, dtype)
                   for slices, data in pieces]
        return TensorRecord(name, np.dtype(dtype).name, shape, ()), futures

    def _write_shard(self, folder: str, index: int, slices, data: Any, dtype) -> tuple[ShardRecord, np.ndarray]:
        host = np.asarray(data)  # a jax array: the device-to-host transfer, or a read-only view on CPU
        if host.dtype != dtype:
            host = host.astype(dtype)
        elif host.flags.writeable and self.config.in_memory_cache:
            host = host.copy()  # the caller's numpy array: the memory cache must not see later changes
        host = np.ascontiguousarray(host).view()  # a view: freezing it leaves the caller's array writable
        host.setflags(write=False)
        payload = memoryview(host.reshape(-1).view(np.uint8)) if host.size else memoryview(b"")
        file = f"t{index:05d}-" + "-".join(str(start) for start, _ in slices) + ".bin" if slices else f"t{index:05d}.bin"
        self.storage.write(f"{folder}/{file}", payload)
        return ShardRecord(file, slices, payload.nbytes, mf.checksum(payload)), host

    def _publish_dtype(self, dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if self.config.publish_dtype and _is_float(dtype):
            return _dtype(self.config.publish_dtype)
        return dtype

    def _merge_parts(self, folder: str, version: int, process_count: int) -> list[TensorRecord]:
        names = [f"{folder}/part-{i:05d}.json" for i in range(process_count)]
        deadline = time.monotonic() + self.config.commit_timeout_s
        while not all(self.storage.exists(n) for n in names):
            if time.monotonic() >= deadline:
                missing = [n for n in names if not self.storage.exists(n)]
                raise TimeoutError(f"version {version}: hosts did not finish writing within "
                                   f"{self.config.commit_timeout_s:.0f}s; missing {missing}")
            time.sleep(self.config.poll_interval_s)
        merged: dict[str, TensorRecord] = {}
        order: list[str] = []
        for name in names:
            for raw in json.loads(self.storage.read(name)):
                shards = tuple(ShardRecord(s["file"], tuple(tuple(i) for i in s["index"]), s["nbytes"], s["checksum"])
                               for s in raw["shards"])
                if raw["name"] not in merged:
                    order.append(raw["name"])
                    merged[raw["name"]] = TensorRecord(raw["name"], raw["dtype"], tuple(raw["shape"]), shards)
                else:
                    previous = merged[raw["name"]]
                    merged[raw["name"]] = TensorRecord(previous.name, previous.dtype, previous.shape,
                                                       previous.shards + shards)
        for record in merged.values():
            _check_coverage(record, where=f"version {version}")
        return [merged[n] for n in order]

    # ------------------------------------------------------------------ loading

    @contextlib.contextmanager
    def lease(self, version: int) -> Iterator[None]:
        """Pin ``version`` against collection while the block runs (lapses after lease_ttl_s if we crash)."""
        path = f"leases/{self.reader_id}-{mf.version_dir(version)}.json"
        body = {"version": version, "reader": self.reader_id, "expires_at": time.time() + self.config.lease_ttl_s}
        self.storage.write(path, json.dumps(body).encode(), atomic=True)
        try:
            yield
        finally:
            self.storage.delete(path)

    def load(self, version: int, *, dtype: Any = None, sharding: ShardingSpec = None,
             as_numpy: bool = False) -> dict[str, Any]:
        """The params of a committed ``version``, verified, cast to ``dtype`` and placed by ``sharding``.

        ``sharding``: a ``jax.sharding.Sharding`` for every tensor, a nested dict of them shaped like
        the params, a function ``name -> Sharding``, or None (the default device). ``as_numpy`` returns
        host arrays instead. Raises a ``WeightStoreError`` (and counts it) for anything but a whole,
        intact version of this run.
        """
        try:
            with self.lease(version):
                manifest = self.manifest(version)
                flat = self._read_verified(version, manifest)
        except WeightStoreError as error:
            raise self._refuse(error, version) from None
        out = {name: _cast(array, dtype) for name, array in flat.items()}
        if not as_numpy:
            out = _place(out, sharding)
        self._count("loaded", version)
        return unflatten_params(out)

    def _read_verified(self, version: int, manifest: Manifest) -> dict[str, np.ndarray]:
        recent = self._recent
        if recent is not None and recent[0] == version:
            return recent[1]
        folder = mf.version_dir(version)
        futures = {(t.name, s.file): self._pool.submit(self._read_shard, folder, t, s)
                   for t in manifest.tensors for s in t.shards}
        try:
            return {tensor.name: _assemble(tensor, {s.file: futures[(tensor.name, s.file)].result() for s in tensor.shards},
                                           where=f"version {version}")
                    for tensor in manifest.tensors}
        finally:
            for future in futures.values():
                future.cancel()

    def _read_shard(self, folder: str, tensor: TensorRecord, shard: ShardRecord) -> np.ndarray:
        path = f"{folder}/{shard.file}"
        where = f"{self.storage.url}/{path} ({tensor.name})"
        try:
            data = self.storage.read_array(path)
        except FileNotFoundError:
            raise IntegrityError(f"{where}: tensor file missing") from None
        if data.nbytes != shard.nbytes:
            raise IntegrityError(f"{where}: {data.nbytes} bytes, manifest says {shard.nbytes} (truncated or overwritten)")
        if mf.checksum(data) != shard.checksum:
            raise IntegrityError(f"{where}: checksum mismatch (corrupted bytes)")
        data.setflags(write=False)
        return data.view(_dtype(tensor.dtype)).reshape(shard.shape)

    # ------------------------------------------------------------------ collecting

    def gc(self, keep: int | None = None) -> list[int]:
        """Remove old versions; returns those removed.

        Keeps the ``keep`` newest committed versions (default ``config.keep``), any version superseded
        less than ``gc_grace_s`` ago, and any version a live lease pins. The commit marker goes first, so
        a version is invisible before its files go. Uncommitted folders older than the newest committed
        version (crashed or superseded publishes) are removed too.
        """
        keep = self.config.keep if keep is None else keep
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        committed = self.versions()
        if not committed:
            return []
        now, pinned = time.time(), self._leased_versions(drop_expired=True)
        removed = []
        for older, newer in zip(committed[:-keep], committed[1:]):
            if older in pinned:
                continue
            try:
                superseded_at = self.marker(newer).committed_at
            except WeightStoreError:
                continue
            if now - superseded_at < self.config.gc_grace_s:
                continue
            self.storage.delete(mf.marker_path(older))
            # A reader leases before it reads the marker; one that read the marker just before it went
            # has its lease visible by now, so its files stay until a later gc finds the lease gone.
            if older not in self._leased_versions():
                self.storage.delete_tree(mf.version_dir(older))
            removed.append(older)
        newest = committed[-1]
        for name in self.storage.list(""):
            version = mf.parse_version_name(name)
            if version is not None and version < newest and version not in committed and version not in pinned:
                self.storage.delete_tree(name)
        if removed:
            self._count("collected", newest, len(removed))
        return removed

    def _leased_versions(self, *, drop_expired: bool = False) -> set[int]:
        pinned, now = set(), time.time()
        for name in self.storage.list("leases"):
            try:
                body = json.loads(self.storage.read(f"leases/{name}"))
            except (FileNotFoundError, ValueError):
                continue  # released while we looked, or being written
            if float(body.get("expires_at", 0)) > now:
                pinned.add(int(body["version"]))
            elif drop_expired:
                self.storage.delete(f"leases/{name}")  # left by a reader that crashed
        return pinned


# ---------------------------------------------------------------------- helpers


def _part_json(records: list[TensorRecord]) -> bytes:
    return json.dumps([dataclasses.asdict(r) for r in records]).encode()


def _normalize_index(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((s.indices(d)[0], s.indices(d)[1]) for s, d in zip(index, shape))


def _assemble(tensor: TensorRecord, arrays: Mapping[str, np.ndarray], *, where: str = "") -> np.ndarray:
    """One host array from the shards of a tensor (no copy when a single shard holds all of it)."""
    if len(tensor.shards) == 1 and tensor.shards[0].shape == tensor.shape:
        return arrays[tensor.shards[0].file]
    _check_coverage(tensor, where=where)
    whole = np.empty(tensor.shape, _dtype(tensor.dtype))
    for shard in tensor.shards:
        whole[tuple(slice(a, b) for a, b in shard.index)] = arrays[shard.file]
    whole.setflags(write=False)
    return whole


def _check_coverage(tensor: TensorRecord, *, where: str) -> None:
    """The shards of a tensor must tile it exactly once (a missing host would leave a hole)."""
    covered = sum(int(np.prod(s.shape)) for s in tensor.shards)
    if covered != int(np.prod(tensor.shape)):
        raise IntegrityError(f"{where}: shards of {tensor.name} cover {covered} of {int(np.prod(tensor.shape))} elements")


def _dtype(name: Any) -> np.dtype:
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    if isinstance(name, str) and name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _cast(array: np.ndarray, dtype: Any) -> np.ndarray:
    if dtype is None:
        return array
    dtype = _dtype(dtype)
    # Only floating tensors change dtype (token tables, counters and masks keep theirs).
    return array if array.dtype == dtype or not _is_float(array.dtype) else array.astype(dtype)


def _place(flat: dict[str, np.ndarray], sharding: ShardingSpec) -> dict[str, Any]:
    import jax

    if sharding is None:
        return {name: jax.device_put(array) for name, array in flat.items()}
    if isinstance(sharding, jax.sharding.Sharding):
        return {name: jax.device_put(array, sharding) for name, array in flat.items()}
    if callable(sharding):
        return {name: jax.device_put(array, sharding(name)) for name, array in flat.items()}
    if isinstance(sharding, Mapping):
        per_name = _flatten_shardings(sharding)
        missing = sorted(set(flat) - set(per_name))
        if missing:
            raise ValueError(f"load: no sharding given for {missing[:3]}{'...' if len(missing) > 3 else ''}")
        return {name: jax.device_put(array, per_name[name]) for name, array in flat.items()}
    raise TypeError(f"sharding must be a Sharding, a nested dict of them, a function of the name, or None; "
                    f"got {type(sharding).__name__}")


def _flatten_shardings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        flat.update(_flatten_shardings(value, name) if isinstance(value, Mapping) else {name: value})
    return flat
