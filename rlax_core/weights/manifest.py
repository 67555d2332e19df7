"""The manifest of one weight version and its commit marker, as JSON.

A version folder ``step_00000012/`` holds one file per stored shard of every tensor and
``manifest.json``: the version (= trainer step), the run id, the time, and for each tensor in index
order its name, dtype, global shape and shards (file, the slice of the global array it holds, its size
and checksum). The commit marker ``committed/step_00000012.json`` is written last; it names the run and
the manifest's own checksum, so a manifest swapped in from elsewhere is caught too.

A version published as a delta names its ``base`` (the version its deltas apply to) in the manifest and
in the commit marker; each delta shard records the size and checksum of its encoded file as well as
those of the values it reconstructs (``nbytes``/``checksum``, the same fields a full shard has).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Mapping

import xxhash

from rlax_core.weights.errors import ManifestError

FORMAT = 2  # 2 added deltas; format 1 manifests (full versions only) still load
READABLE_FORMATS = (1, 2)
CHECKSUM = "xxh3_64"  # several GB/s on one core: about twice crc32c here, so verifying costs little


def checksum(data: bytes | memoryview) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def version_dir(version: int) -> str:
    return f"step_{version:08d}"


def marker_path(version: int) -> str:
    return f"committed/{version_dir(version)}.json"


def parse_version_name(name: str) -> int | None:
    """``step_00000012`` or ``step_00000012.json`` -> 12; anything else -> None."""
    stem = name.removesuffix(".json")
    if not stem.startswith("step_") or not stem[5:].isdigit():
        return None
    return int(stem[5:])


@dataclasses.dataclass(frozen=True)
class DeltaRecord:
    """The encoded file of a delta shard: checked before a byte of it is decoded."""

    nbytes: int
    checksum: str
    codec: str


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    file: str
    index: tuple[tuple[int, int], ...]  # [start, stop) per dimension of the global array
    nbytes: int  # of the values (C order, the tensor's dtype); for a delta shard, once reconstructed
    checksum: str
    delta: DeltaRecord | None = None  # None: the file holds the values; else their delta against the base

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.index)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ShardRecord":
        delta = raw.get("delta")
        return cls(raw["file"], tuple(tuple(i) for i in raw["index"]), int(raw["nbytes"]), raw["checksum"],
                   None if delta is None else DeltaRecord(int(delta["nbytes"]), str(delta["checksum"]), str(delta["codec"])))


@dataclasses.dataclass(frozen=True)
class TensorRecord:
    name: str  # "/"-joined path in the params tree
    dtype: str
    shape: tuple[int, ...]
    shards: tuple[ShardRecord, ...]


@dataclasses.dataclass(frozen=True)
class Manifest:
    version: int
    run_id: str
    created: float
    tensors: tuple[TensorRecord, ...]
    checksum_algorithm: str = CHECKSUM
    format: int = FORMAT
    base: int | None = None  # the version this one's delta shards apply to; None for a full version
    chain_length: int = 0  # deltas since the last full version (0 for a full version)
    # An adapter-only version (rlax_core.weights.adapters): {"base_version", "base_checksum", "lora"}.
    # Its tensors are LoRA adapters to merge into that full version, pinned by its manifest checksum.
    adapter: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the values this version holds."""
        return sum(s.nbytes for t in self.tensors for s in t.shards)

    @property
    def stored_nbytes(self) -> int:
        """Bytes of its tensor files (smaller than ``nbytes`` for a delta)."""
        return sum(s.delta.nbytes if s.delta else s.nbytes for t in self.tensors for s in t.shards)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> "Manifest":
        try:
            raw = json.loads(data)
            tensors = tuple(
                TensorRecord(name=t["name"], dtype=t["dtype"], shape=tuple(t["shape"]),
                             shards=tuple(ShardRecord.from_dict(s) for s in t["shards"]))
                for t in raw["tensors"]
            )
            base = raw.get("base")
            adapter = raw.get("adapter")
            manifest = cls(int(raw["version"]), str(raw["run_id"]), float(raw["created"]), tensors,
                           raw["checksum_algorithm"], int(raw["format"]), None if base is None else int(base),
                           int(raw.get("chain_length", 0)), None if adapter is None else dict(adapter))
        except (ValueError, KeyError, TypeError) as error:
            raise ManifestError(f"{where}: unreadable manifest ({error})") from None
        if manifest.format not in READABLE_FORMATS or manifest.checksum_algorithm != CHECKSUM:
            raise ManifestError(f"{where}: manifest format {manifest.format}/{manifest.checksum_algorithm} "
                                f"is not one of {READABLE_FORMATS}/{CHECKSUM}")
        has_deltas = any(s.delta is not None for t in manifest.tensors for s in t.shards)
        # A base at or after the version itself would make a reader walk in circles.
        if manifest.base is not None and not 0 <= manifest.base < manifest.version:
            raise ManifestError(f"{where}: base {manifest.base} is not an earlier version than {manifest.version}")
        if has_deltas != (manifest.base is not None) or (manifest.chain_length > 0) != has_deltas:
            raise ManifestError(f"{where}: delta shards, base {manifest.base} and chain length "
                                f"{manifest.chain_length} disagree")
        return manifest


@dataclasses.dataclass(frozen=True)
class CommitMarker:
    version: int
    run_id: str
    manifest_checksum: str
    committed_at: float
    # The version's delta base, here too so that the collector learns which versions live deltas need
    # from the markers it reads anyway.
    base: int | None = None
    adapter_base: int | None = None  # the full version an adapter-only version applies to (kept likewise)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> "CommitMarker":
        try:
            raw: Mapping[str, Any] = json.loads(data)
            base, adapter_base = raw.get("base"), raw.get("adapter_base")
            return cls(int(raw["version"]), str(raw["run_id"]), str(raw["manifest_checksum"]), float(raw["committed_at"]),
                       None if base is None else int(base), None if adapter_base is None else int(adapter_base))
        except (ValueError, KeyError, TypeError) as error:
            raise ManifestError(f"{where}: unreadable commit marker ({error})") from None

    @classmethod
    def for_manifest(cls, manifest: Manifest, manifest_bytes: bytes) -> "CommitMarker":
        adapter_base = None if manifest.adapter is None else int(manifest.adapter["base_version"])
        return cls(manifest.version, manifest.run_id, checksum(manifest_bytes), time.time(), manifest.base, adapter_base)
