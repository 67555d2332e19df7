"""The manifest of one weight version and its commit marker, as JSON.

A version folder ``step_00000012/`` holds one file per stored shard of every tensor and
``manifest.json``: the version (= trainer step), the run id, the time, and for each tensor in index
order its name, dtype, global shape and shards (file, the slice of the global array it holds, its size
and checksum). The commit marker ``committed/step_00000012.json`` is written last; it names the run and
the manifest's own checksum, so a manifest swapped in from elsewhere is caught too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Mapping

import xxhash

from rlax_core.weights.errors import ManifestError

FORMAT = 1
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
class ShardRecord:
    file: str
    index: tuple[tuple[int, int], ...]  # [start, stop) per dimension of the global array
    nbytes: int
    checksum: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.index)


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

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for t in self.tensors for s in t.shards)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> "Manifest":
        try:
            raw = json.loads(data)
            tensors = tuple(
                TensorRecord(
                    name=t["name"], dtype=t["dtype"], shape=tuple(t["shape"]),
                    shards=tuple(ShardRecord(s["file"], tuple(tuple(i) for i in s["index"]), int(s["nbytes"]), s["checksum"])
                                 for s in t["shards"]),
                )
                for t in raw["tensors"]
            )
            manifest = cls(int(raw["version"]), str(raw["run_id"]), float(raw["created"]), tensors,
                           raw["checksum_algorithm"], int(raw["format"]))
        except (ValueError, KeyError, TypeError) as error:
            raise ManifestError(f"{where}: unreadable manifest ({error})") from None
        if manifest.format != FORMAT or manifest.checksum_algorithm != CHECKSUM:
            raise ManifestError(f"{where}: manifest format {manifest.format}/{manifest.checksum_algorithm} "
                                f"is not {FORMAT}/{CHECKSUM}")
        return manifest


@dataclasses.dataclass(frozen=True)
class CommitMarker:
    version: int
    run_id: str
    manifest_checksum: str
    committed_at: float

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> "CommitMarker":
        try:
            raw: Mapping[str, Any] = json.loads(data)
            return cls(int(raw["version"]), str(raw["run_id"]), str(raw["manifest_checksum"]), float(raw["committed_at"]))
        except (ValueError, KeyError, TypeError) as error:
            raise ManifestError(f"{where}: unreadable commit marker ({error})") from None

    @classmethod
    def for_manifest(cls, manifest: Manifest, manifest_bytes: bytes) -> "CommitMarker":
        return cls(manifest.version, manifest.run_id, checksum(manifest_bytes), time.time())
