"""A writer publishes and collects while several reader processes load: nobody fails, nothing mixes."""

from __future__ import annotations

import multiprocessing
import queue
import time

import pytest

from rlax_core.weights import WeightStore, WeightStoreConfig
from tests.weights.stress_reader import follow_until
from tests.weights.versioned_params import params_for

READERS, VERSIONS, TIMEOUT_S = 3, 20, 120.0


# Local: ~6 s on 2 busy cores (3 reader processes start); gs:// through the emulator: ~30 s, slow lane.
# With deltas (a full version every 4) the collector must also keep the bases of every version it keeps.
@pytest.mark.parametrize("full_snapshot_every", [1, 4], ids=["full", "deltas"])
@pytest.mark.parametrize("backend", ["local", pytest.param("gs", marks=pytest.mark.slow)])
def test_readers_never_fail_or_see_a_mixed_version_while_the_writer_collects(backend, full_snapshot_every, tmp_path,
                                                                             request):
    root = str(tmp_path / "weights") if backend == "local" else f"{request.getfixturevalue('gcs_emulator').make_bucket()}/w"
    # A short grace period so that collection really races the readers.
    writer = WeightStore(WeightStoreConfig(root=root, run_id="stress", keep=2, gc_grace_s=0.2,
                                           full_snapshot_every=full_snapshot_every))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    readies = [context.Event() for _ in range(READERS)]
    readers = [context.Process(target=follow_until, args=(root, "stress", VERSIONS, TIMEOUT_S, ready, results,
                                                          full_snapshot_every), daemon=True)
               for ready in readies]
    for process in readers:
        process.start()
    try:
        for ready in readies:
            assert ready.wait(timeout=TIMEOUT_S), "a reader process did not start"
        collected = []
        for version in range(1, VERSIONS + 1):
            writer.publish(version, params_for(version))
            collected += writer.gc()
            time.sleep(0.03)
        reports = []
        for _ in readers:
            try:
                reports.append(results.get(timeout=TIMEOUT_S))
            except queue.Empty:
                pytest.fail("a reader process did not report within the timeout")
    finally:
        for process in readers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        writer.close()

    assert collected, "the writer never collected anything: the test raced nothing"
    for report in reports:
        assert report["errors"] == [] and report["refused"] == {}, report
        assert report["seen"] == sorted(set(report["seen"])) and report["seen"][-1] == VERSIONS, report
    assert sum(len(r["seen"]) for r in reports) >= READERS * 2
    assert len(writer.versions()) <= 2 + 10  # old versions went (the grace period keeps the last few)
    if full_snapshot_every > 1:
        assert any(writer.manifest(v).base is not None for v in writer.versions()), "no version was a delta"
