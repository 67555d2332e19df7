"""``WeightFollower``: the rollout side's view of the newest usable weights.

It loads each newer committed version once. A version it cannot verify (corrupt, foreign, vanished)
is counted, logged, remembered and reported to the store (``rlax_core.weights.repair``), and the
follower keeps serving the version it had; a follower that has nothing yet walks back to the newest
version that verifies. A refused version is tried again only once the trainer has repaired it (the
report is gone), never on every poll.

An adapter-only version (``adapters.py``) is handed over merged into its base by default. The
follower keeps that base, so the next adapter version on it reads only its adapters.

``merge_adapters=False`` is for a consumer that holds the base itself, the engine (``hand_to``):
the follower keeps only the key of the base the engine holds, and hands over a full version's
params (``update_weights``) or an adapter version's adapters (``update_adapters``, with the base
too when the version pins another). The base is then held once, on the engine, and each adapter
version on it costs the adapters' bytes only.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from rlax_core.weights.adapters import BaseKey, HeldBase, VersionParts, load_parts, load_version
from rlax_core.weights.errors import VersionNotCommittedError, WeightStoreError
from rlax_core.weights.repair import refusal_reported, report_refusal
from rlax_core.weights.store import ShardingSpec, WeightStore

log = logging.getLogger(__name__)


class WeightFollower:
    def __init__(self, store: WeightStore, *, dtype: Any = None, sharding: ShardingSpec = None, as_numpy: bool = False,
                 merge_adapters: bool = True):
        self.store = store
        self._load_options = dict(dtype=dtype, sharding=sharding, as_numpy=as_numpy)
        self.merge_adapters = merge_adapters
        self.version: int | None = None
        self.params: Any = None  # merge_adapters: the complete params of ``version``
        self.refused: dict[int, str] = {}  # version -> why, for versions not repaired since
        self.base: HeldBase | None = None  # merge_adapters: the full version the last adapter version was merged into
        self.parts: VersionParts | None = None  # not merge_adapters: what changed since the last ``hand_to``
        self.held: BaseKey | None = None  # not merge_adapters: the base the consumer holds once it takes ``parts``

    def refresh(self, up_to: int | None = None) -> bool:
        """Load the newest committed version that verifies, if it is newer than ours (and at most
        ``up_to`` when given); True when the params changed."""
        self._forget_repaired()
        for _ in range(3):
            committed = self.store.versions()
            candidates = [v for v in reversed(committed) if v not in self.refused
                          and (self.version is None or v > self.version) and (up_to is None or v <= up_to)]
            vanished = False
            for version in candidates:  # newest first: a refused one falls back to the one before
                try:
                    if self.merge_adapters:
                        params, base = load_version(self.store, version, held_base=self.base, **self._load_options)
                    else:
                        parts = load_parts(self.store, version, held=self.held, **self._load_options)
                except VersionNotCommittedError:
                    vanished = True  # collected between listing and loading
                    continue
                except WeightStoreError as error:
                    self._refuse(version, error)
                    continue
                if self.merge_adapters:
                    self.version, self.params, self.base = version, params, base
                else:
                    self.version, self.parts, self.held = version, self._not_yet_handed(parts), parts.base
                return True
            if not vanished:
                return False
        return False

    def take(self) -> tuple[int | None, Any]:
        """(version, params) of the last load, letting go of the params (a consumer that copies them
        into its own buffers, like the engine, need not keep a second copy alive)."""
        if not self.merge_adapters:
            raise RuntimeError("a follower with merge_adapters=False hands its versions over with hand_to(engine)")
        params, self.params = self.params, None
        return self.version, params

    def hand_to(self, engine) -> int | None:
        """Give ``engine`` (an ``Engine`` or ``ReplicatedEngine``) the version loaded since the last
        call; returns it, or None when there was none. Merging, the complete params
        (``update_weights``); otherwise a full version's params, or an adapter version's adapters
        (``update_adapters``) with its base when the engine does not hold that one yet."""
        if self.merge_adapters:
            version, params = self.take()
            if params is None:
                return None
            engine.update_weights(params, version)
            return version
        parts, self.parts = self.parts, None
        if parts is None:
            return None
        if parts.adapters is None:
            engine.update_weights(parts.params, parts.version)
        else:
            engine.update_adapters(parts.adapters, parts.lora, parts.version, base=parts.params)
            log.info("engine took adapter version %d on base version %d (%s)", parts.version, parts.base.version,
                     "the base read with it" if parts.params is not None else "the base it holds")
        return parts.version

    def _not_yet_handed(self, parts: VersionParts) -> VersionParts:
        """``parts``, carrying a base loaded for an earlier version that was never handed over (the
        ``held`` key already names it, so this load did not read it again)."""
        earlier = self.parts
        if parts.params is None and earlier is not None and earlier.base == parts.base:
            return dataclasses.replace(parts, params=earlier.params)
        return parts

    def _refuse(self, version: int, error: WeightStoreError) -> None:
        self.refused[version] = str(error)
        log.error("keeping weight version %s: version %d refused (%s)", self.version, version, error)
        try:
            report_refusal(self.store, version, f"{error.reason}: {error}")
        except OSError as report_error:  # the report helps the writer heal; its loss stops nothing
            log.warning("could not report the refusal of version %d: %s", version, report_error)

    def _forget_repaired(self) -> None:
        for version in [v for v in self.refused if self.version is None or v > self.version]:
            if not refusal_reported(self.store, version):
                log.info("weight version %d was repaired; trying it again", version)
                del self.refused[version]

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
