"""Blob storage under one root: a local folder (plain files) or any fsspec URL (gs:// through gcsfs).

The store needs only whole-object writes and reads, listing one folder, and deletion. Local writes of
small control files (manifests, commit markers, leases) are atomic (temporary name, then rename) so
that a reader never sees half of one; tensor files need not be, because nothing reads them before the
commit marker exists and their checksums are verified anyway. GCS object writes are atomic by nature.

Tensor files go through ``writer``/``reader``, which take and give them piece by piece, so that a shard
is cast, hashed and written (or read and hashed) one cache-sized chunk at a time.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO, ContextManager, Protocol

import numpy as np

from rlax_core.utils.paths import is_remote


class Storage(Protocol):
    url: str

    def write(self, path: str, data: bytes | memoryview, *, atomic: bool = False) -> None: ...

    def read(self, path: str) -> bytes: ...

    def writer(self, path: str) -> ContextManager[BinaryIO]:
        """A file-like to ``write()`` an object piece by piece; it exists once the block ends."""

    def reader(self, path: str) -> ContextManager[tuple[int, BinaryIO]]:
        """``(size, file-like with readinto())`` of an object; FileNotFoundError when there is none."""

    def exists(self, path: str) -> bool: ...

    def list(self, folder: str) -> list[str]: ...

    def delete(self, path: str) -> None: ...

    def delete_tree(self, folder: str) -> None: ...

    def files(self, folder: str) -> dict[str, int]:
        """Every file under ``folder``, at any depth: its path relative to ``folder`` -> its size in bytes."""

    def move(self, source: str, target: str) -> None:
        """Rename a file or a folder (on gs://: copy, then delete)."""


class LocalStorage:
    """Plain files under a folder (also the fastest path on a local disk or a mounted filesystem)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, path: str) -> Path:
        return self.root / path

    def write(self, path: str, data: bytes | memoryview, *, atomic: bool = False) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not atomic:
            with open(target, "wb") as f:
                f.write(data)
            return
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        with open(staging, "wb") as f:
            f.write(data)
        os.replace(staging, target)

    def read(self, path: str) -> bytes:
        with open(self._path(path), "rb") as f:
            return f.read()

    @contextlib.contextmanager
    def writer(self, path: str):
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            yield f

    @contextlib.contextmanager
    def reader(self, path: str):
        with open(self._path(path), "rb") as f:
            yield os.fstat(f.fileno()).st_size, f

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def list(self, folder: str) -> list[str]:
        try:
            return sorted(p.name for p in self._path(folder).iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return []

    def delete(self, path: str) -> None:
        self._path(path).unlink(missing_ok=True)

    def delete_tree(self, folder: str) -> None:
        shutil.rmtree(self._path(folder), ignore_errors=True)

    def files(self, folder: str) -> dict[str, int]:
        top = self._path(folder)
        found = {}
        for directory, _, names in os.walk(top):
            for name in names:
                path = Path(directory) / name
                found[path.relative_to(top).as_posix()] = path.stat().st_size
        return found

    def move(self, source: str, target: str) -> None:
        self._path(target).parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(source), self._path(target))


class FsspecStorage:
    """Objects under an fsspec URL (``gs://bucket/prefix`` through gcsfs, ``memory://`` in tests).

    Listings are never cached: a reader polling for new versions must see new commit markers at once.
    gcsfs honours ``STORAGE_EMULATOR_HOST``, which is how the tests point it at a local GCS emulator.
    """

    def __init__(self, url: str):
        import fsspec
        import fsspec.config

        protocol = url.split("://", 1)[0]
        self.url = url.rstrip("/")
        if protocol in ("gs", "gcs"):
            # The plain JSON-API client: the weight store needs objects only, not the zonal/hierarchical
            # extensions, whose bucket-layout probe (gRPC) adds a round trip and fails on emulators.
            from gcsfs.core import GCSFileSystem

            options = {**fsspec.config.conf.get("gs", {}), "use_listings_cache": False, "skip_instance_cache": True}
            self.fs = GCSFileSystem(**options)
        else:
            self.fs = fsspec.filesystem(protocol, use_listings_cache=False, skip_instance_cache=True)
        self._prefix = self.fs._strip_protocol(self.url)

    def _path(self, path: str) -> str:
        return f"{self._prefix}/{path}"

    def write(self, path: str, data: bytes | memoryview, *, atomic: bool = False) -> None:
        self.fs.pipe_file(self._path(path), bytes(data) if isinstance(data, memoryview) else data)

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self._path(path))

    @contextlib.contextmanager
    def writer(self, path: str):
        # One request per object: a resumable upload would add round trips, and the whole object is
        # in memory on the trainer anyway.
        collected = io.BytesIO()
        yield collected
        self.fs.pipe_file(self._path(path), collected.getvalue())

    @contextlib.contextmanager
    def reader(self, path: str):
        data = self.read(path)
        yield len(data), io.BytesIO(data)

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._path(path))

    def list(self, folder: str) -> list[str]:
        try:
            entries = self.fs.ls(self._path(folder), detail=False)
        except FileNotFoundError:
            return []
        return sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in entries)

    def delete(self, path: str) -> None:
        try:
            self.fs.rm_file(self._path(path))
        except FileNotFoundError:
            pass

    def delete_tree(self, folder: str) -> None:
        try:
            self.fs.rm(self._path(folder), recursive=True)
        except FileNotFoundError:
            pass

    def files(self, folder: str) -> dict[str, int]:
        top = self._path(folder).rstrip("/")
        found = self.fs.find(top, detail=True)
        return {name[len(top) + 1:]: int(info["size"]) for name, info in found.items()
                if info.get("type") != "directory" and name.startswith(top + "/")}

    def move(self, source: str, target: str) -> None:
        self.fs.mv(self._path(source), self._path(target), recursive=True)


ALIGNMENT = 64  # jax.device_put on CPU adopts a read-only host buffer without copying only if 64-byte aligned


def aligned_empty(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset:offset + nbytes]


def open_storage(root: str) -> Storage:
    """``/a/folder`` or ``file:///a/folder`` -> LocalStorage; ``gs://...`` or ``memory://...`` -> fsspec."""
    if root.startswith("file://"):
        return LocalStorage(root[len("file://"):])
    if is_remote(root):
        return FsspecStorage(root)
    return LocalStorage(root)
