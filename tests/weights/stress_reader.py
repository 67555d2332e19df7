"""A reader process of the stress test: follows the store until it has loaded the last version."""

from __future__ import annotations

import time

from rlax_core.weights import WeightFollower, WeightStore, WeightStoreConfig
from tests.weights.versioned_params import assert_is_version


def follow_until(root: str, run_id: str, last_version: int, timeout_s: float, ready, results,
                 full_snapshot_every: int = 1) -> None:
    report = {"seen": [], "errors": [], "refused": {}, "counters": {}}
    try:
        with WeightStore(WeightStoreConfig(root=root, run_id=run_id, full_snapshot_every=full_snapshot_every)) as store:
            follower = WeightFollower(store, as_numpy=True)
            ready.set()
            deadline = time.monotonic() + timeout_s
            while follower.version != last_version and time.monotonic() < deadline:
                try:
                    if follower.refresh():
                        assert_is_version(follower.params, follower.version)  # never a mix of two versions
                        report["seen"].append(follower.version)
                    else:
                        time.sleep(0.005)  # poll, but leave the CPU to the writer
                except Exception as error:  # noqa: BLE001 - every failure is reported to the test
                    report["errors"].append(f"{type(error).__name__}: {error}")
            report["refused"], report["counters"] = follower.refused, dict(store.counters)
    except Exception as error:  # noqa: BLE001
        report["errors"].append(f"{type(error).__name__}: {error}")
    finally:
        ready.set()
        results.put(report)
