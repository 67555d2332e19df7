"""``WeightStoreConfig``: where weights are published and how readers and the collector behave."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from rlax_core.config import require


@dataclasses.dataclass(frozen=True)
class WeightStoreConfig:
    """One weight store, shared by the trainer (writer) and every rollout worker (readers).

    ``root`` is a local folder or a ``gs://bucket/prefix`` URL. ``run_id`` names the run that owns the
    store: a reader refuses any version whose manifest names another run (a stale folder of an earlier
    run, a copy from elsewhere). ``publish_dtype`` casts float tensors before they leave the trainer
    (``bfloat16`` halves the bytes that every worker pulls); ``None`` keeps the trainer's dtype.
    """

    root: str
    run_id: str
    publish_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    # Collector: keep this many newest versions, and never remove a version that was superseded less
    # than gc_grace_s ago (a reader that saw it as newest may still be loading it).
    keep: int = 2
    gc_grace_s: float = 60.0
    # A reader's lease pins the version it loads; a crashed reader's lease lapses after lease_ttl_s.
    lease_ttl_s: float = 600.0
    # watch(): how often to look for a new version, and how long to wait before failing loudly.
    poll_interval_s: float = 1.0
    watch_timeout_s: float = 600.0
    # Multi-host publish: how long process 0 waits for the other hosts' shards before giving up.
    commit_timeout_s: float = 600.0
    # Parallel shard reads and writes on gs:// (a local folder uses at most one per CPU core).
    io_threads: int = 8
    # Longest wait for one tensor's shard reads (load) or writes (publish) before failing loudly with
    # StorageTimeoutError; also bounds how long close() waits for I/O still running.
    io_timeout_s: float = 600.0
    # Keep the newest published version in this process's memory, so a reader in the same process
    # (the local quickstart loop) skips the storage round trip; checksums are still verified.
    in_memory_cache: bool = False
    # Deltas: publish every Nth version in full and the versions between as deltas against the version
    # published before them (XOR, byte planes, zstd). 1 = every version in full (deltas off): on a local
    # folder deltas cost more CPU than the bytes they save (docs/weights.md has the measurements); on
    # gs:// they pay. Writer and readers then keep their newest version in host memory to diff against.
    full_snapshot_every: int = 1

    def __post_init__(self):
        require(bool(self.root), "root", "a local folder or a gs://bucket/prefix URL")
        require("://" not in self.root or self.root.split("://", 1)[0] in ("gs", "file", "memory"),
                "root", "a local folder, file://, gs:// or memory:// URL")
        require(bool(self.run_id) and "/" not in self.run_id, "run_id", "a non-empty name without '/'")
        require(self.keep >= 1, "keep", "at least 1 (the newest version is never collected)")
        require(self.gc_grace_s >= 0, "gc_grace_s", "seconds >= 0")
        require(self.lease_ttl_s > 0, "lease_ttl_s", "seconds > 0")
        require(self.poll_interval_s > 0, "poll_interval_s", "seconds > 0")
        require(self.watch_timeout_s > 0, "watch_timeout_s", "seconds > 0")
        require(self.commit_timeout_s > 0, "commit_timeout_s", "seconds > 0")
        require(self.io_timeout_s > 0, "io_timeout_s", "seconds > 0")
        require(1 <= self.io_threads <= 256, "io_threads", "an integer in [1, 256]")
        require(1 <= self.full_snapshot_every <= 1000, "full_snapshot_every",
                "an integer in [1, 1000] (1 = no deltas; a reader may have to apply that many - 1 in a row)")
