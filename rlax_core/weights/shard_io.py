"""One stored shard in and out: cast, checksum, delta and I/O in one pass over cache-sized chunks.

Why one pass: on a host with a local folder (page cache) the costs are memory passes, not storage. A
float32 -> bfloat16 cast of a whole tensor allocates a fresh output (page faults: measured ~1 GB/s on
first touch here), then a checksum pass and a write pass read it again. Cast, hashed and written one
chunk at a time, the output never leaves the cache and, unless the store keeps it, is never allocated
in full. Reads likewise hash each chunk right after it lands in its 64-byte-aligned destination (which
``jax.device_put`` on CPU then adopts without a copy).
"""

from __future__ import annotations

import numpy as np
import xxhash

from rlax_core.weights.delta import CHUNK_ELEMENTS, CODEC, DeltaEncoder, chunk_bounds, decode_delta
from rlax_core.weights.errors import IntegrityError
from rlax_core.weights.manifest import DeltaRecord, ShardRecord
from rlax_core.utils.storage import Storage, aligned_empty

READ_CHUNK_BYTES = 1 << 20  # hashed while still in the cache


def write_shard(storage: Storage, path: str, values: np.ndarray, dtype: np.dtype, *, keep: bool,
                base: np.ndarray | None) -> tuple[int, str, DeltaRecord | None, np.ndarray | None]:
    """Write ``values`` cast to ``dtype`` (as a delta against ``base`` when given) to ``path``.

    Returns ``(nbytes, checksum, delta record or None, stored values or None)``: size and checksum are
    of the values as stored (after the cast), whatever the file holds; the stored values (flat,
    read-only, never the caller's writable array) come back when ``keep``.
    """
    flat = np.ascontiguousarray(values).reshape(-1)
    casting = flat.dtype != dtype
    if casting:
        stored = aligned_empty(flat.size * dtype.itemsize).view(dtype) if keep else None
        scratch = None if keep else np.empty(min(CHUNK_ELEMENTS, flat.size), dtype)
    else:
        # The caller may reuse its own (writable) arrays at once; a kept copy must not change with them.
        stored = flat
        if keep and flat.flags.writeable:
            stored = aligned_empty(flat.nbytes).view(dtype)
            stored[:] = flat
    values_hash, delta_hash = xxhash.xxh3_64(), xxhash.xxh3_64()
    with storage.writer(path) as sink:
        encoder = None if base is None else DeltaEncoder(sink, dtype, flat.size, delta_hash.update)
        for start, stop in chunk_bounds(flat.size):
            if casting:
                chunk = stored[start:stop] if stored is not None else scratch[:stop - start]
                np.copyto(chunk, flat[start:stop], casting="unsafe")
            else:
                chunk = stored[start:stop]
            chunk_bytes = chunk.view(np.uint8)
            values_hash.update(chunk_bytes)
            if encoder is None:
                sink.write(chunk_bytes)
            else:
                encoder.add(chunk, base[start:stop])
        delta = None if encoder is None else DeltaRecord(encoder.finish(), delta_hash.hexdigest(), CODEC)
    if stored is not None:
        stored = stored.view()  # a view: freezing it leaves a caller's array as it was
        stored.setflags(write=False)
    return flat.size * dtype.itemsize, values_hash.hexdigest(), delta, stored if keep else None


def read_shard(storage: Storage, path: str, shard: ShardRecord, dtype: np.dtype, base: np.ndarray | None,
               *, where: str) -> np.ndarray:
    """The verified values of one shard, flat and read-only: read whole, or rebuilt from its delta and
    ``base`` (the same slice of the base version, flat). Raises ``IntegrityError`` for anything else."""
    try:
        if shard.delta is None:
            values = _read_values(storage, path, shard, where=where)
        else:
            values = _rebuild_from_delta(storage, path, shard, dtype, base, where=where)
    except FileNotFoundError:
        raise IntegrityError(f"{where}: tensor file missing") from None
    values.setflags(write=False)
    return values.view(dtype)


def _read_values(storage: Storage, path: str, shard: ShardRecord, *, where: str) -> np.ndarray:
    values_hash = xxhash.xxh3_64()
    with storage.reader(path) as (size, file):
        if size != shard.nbytes:
            raise IntegrityError(f"{where}: {size} bytes, manifest says {shard.nbytes} (truncated or overwritten)")
        buffer = aligned_empty(size)
        view = memoryview(buffer)
        for start in range(0, size, READ_CHUNK_BYTES):
            part = view[start:start + READ_CHUNK_BYTES]
            if file.readinto(part) != len(part):
                raise IntegrityError(f"{where}: shorter than {size} bytes while being read (overwritten)")
            values_hash.update(part)
    if values_hash.hexdigest() != shard.checksum:
        raise IntegrityError(f"{where}: checksum mismatch (corrupted bytes)")
    return buffer


def _rebuild_from_delta(storage: Storage, path: str, shard: ShardRecord, dtype: np.dtype, base: np.ndarray | None,
                        *, where: str) -> np.ndarray:
    delta = shard.delta
    if delta.codec != CODEC:
        raise IntegrityError(f"{where}: delta codec {delta.codec!r} is not {CODEC!r}")
    payload = storage.read(path)
    # Nothing of a delta is decoded before its own size and checksum hold: a corrupt delta is never applied.
    if len(payload) != delta.nbytes:
        raise IntegrityError(f"{where}: delta of {len(payload)} bytes, manifest says {delta.nbytes} (truncated "
                             "or overwritten); not applied")
    if xxhash.xxh3_64_hexdigest(payload) != delta.checksum:
        raise IntegrityError(f"{where}: delta checksum mismatch (corrupted bytes); not applied")
    if base is None or base.dtype != dtype or base.nbytes != shard.nbytes:
        raise IntegrityError(f"{where}: no base values of {shard.nbytes} bytes of {dtype} to apply the delta to")
    rebuilt = aligned_empty(shard.nbytes).view(dtype)
    values_hash = xxhash.xxh3_64()
    try:
        decode_delta(payload, base, rebuilt, lambda chunk: values_hash.update(chunk.view(np.uint8)))
    except ValueError as error:
        raise IntegrityError(f"{where}: {error}") from None
    if values_hash.hexdigest() != shard.checksum:
        raise IntegrityError(f"{where}: values rebuilt from the delta differ from the manifest's checksum "
                             "(wrong base?)")
    return rebuilt.view(np.uint8)
