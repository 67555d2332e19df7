"""``WeightFollower``: the rollout side's view of the newest usable weights.

It loads each newer committed version once; a version that is refused (corrupt, foreign, vanished)
is counted, logged and remembered, and the follower keeps serving the version it had.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlax_core.weights.errors import VersionNotCommittedError, WeightStoreError
from rlax_core.weights.store import ShardingSpec, WeightStore

log = logging.getLogger(__name__)


class WeightFollower:
    def __init__(self, store: WeightStore, *, dtype: Any = None, sharding: ShardingSpec = None, as_numpy: bool = False):
        self.store = store
        self._load_options = dict(dtype=dtype, sharding=sharding, as_numpy=as_numpy)
        self.version: int | None = None
        self.params: Any = None
        self.refused: dict[int, str] = {}

    def refresh(self) -> bool:
        """Load the newest committed version if it is newer than ours; True when the params changed."""
        for _ in range(3):
            newest = self.store.latest()
            if newest is None or (self.version is not None and newest <= self.version) or newest in self.refused:
                return False
            try:
                params = self.store.load(newest, **self._load_options)
            except VersionNotCommittedError:
                continue  # collected between listing and loading: a newer one exists, look again
            except WeightStoreError as error:
                self.refused[newest] = str(error)
                log.error("keeping weight version %s: version %d refused (%s)", self.version, newest, error)
                return False
            self.version, self.params = newest, params
            return True
        return False

    def wait_for(self, min_version: int, *, timeout_s: float | None = None) -> int:
        """Block until a version >= ``min_version`` is loaded (the staleness bound's pacing); returns it."""
        config = self.store.config
        timeout_s = config.watch_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            self.refresh()
            if self.version is not None and self.version >= min_version:
                return self.version
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no usable weight version >= {min_version} in {self.store.storage.url} within "
                                   f"{timeout_s:.0f}s (have {self.version}; refused {sorted(self.refused)})")
            time.sleep(config.poll_interval_s)
