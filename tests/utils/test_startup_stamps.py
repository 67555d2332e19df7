"""rlax_core.utils.startup: start-up stamps marked once, handed on once, joined across processes."""

from __future__ import annotations

import json
import time

import pytest

from rlax_core.utils import startup


@pytest.fixture(autouse=True)
def fresh_stamps(monkeypatch):
    monkeypatch.setattr(startup, "_stamps", {})
    monkeypatch.setattr(startup, "_handed_on", set())


def test_the_first_mark_of_a_hop_wins_and_take_hands_each_stamp_on_once():
    startup.mark("trainer_model", at=10.0)
    startup.mark("trainer_model", at=20.0)
    assert startup.stamps() == {"startup/trainer_model_t": 10.0}
    assert startup.take() == {"startup/trainer_model_t": 10.0}
    startup.mark("trainer_publish", at=30.0)
    assert startup.take() == {"startup/trainer_publish_t": 30.0}
    assert startup.take() == {}
    startup.mark("trainer_model", at=40.0)  # handed on already: still marked, not re-stamped
    assert startup.stamps()["startup/trainer_model_t"] == 10.0


def test_a_process_start_is_stamped_from_proc():
    started = startup.process_started_at()
    if started is None:
        pytest.skip("no /proc here")
    assert started <= time.time()
    startup.mark_process_start("trainer")
    assert startup.stamps()["startup/trainer_process_t"] == pytest.approx(started, abs=1.0)


def test_rollout_processes_stamps_are_joined_taking_each_hops_earliest(tmp_path, monkeypatch):
    root = str(tmp_path / "rollouts")
    startup.mark("worker_start", at=5.0)
    startup.mark("engine_compiled", at=9.0)
    startup.write_stamps(root, "run", "worker")
    other = tmp_path / "rollouts" / "run-metrics" / "startup" / "worker-otherhost-1.json"
    other.write_text(json.dumps({"startup/worker_start_t": 6.0, "startup/engine_compiled_t": 8.0}))
    (other.parent / "worker-otherhost-2.json").write_text('{"startup/worker_start_t": ')  # caught mid-write
    assert startup.read_stamps(root, "run") == {"startup/worker_start_t": 5.0, "startup/engine_compiled_t": 8.0}
    assert startup.read_stamps(str(tmp_path / "nothing"), "run") == {}


def test_a_store_that_refuses_the_stamps_costs_only_the_stamps(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    startup.mark("worker_start", at=1.0)
    with caplog.at_level("WARNING", logger=startup.__name__):
        startup.write_stamps(str(blocked), "run", "worker")  # logs, does not raise
    assert "start-up stamps not written to" in caplog.text and str(blocked) in caplog.text
    assert blocked.read_text() == "not a folder"  # nothing written over it
    assert startup.stamps() == {"startup/worker_start_t": 1.0}  # the process keeps its stamps


def test_the_timeline_is_seconds_since_the_launch_in_hop_order():
    row = {"startup/launch_t": 100.0, "startup/engine_compiled_t": 112.5, "startup/trainer_process_t": 101.0,
           "startup/trainer_first_read_t": 113.0, "other/metric": 7.0}
    timeline = startup.startup_timeline(row)
    assert timeline == {"launch": 0.0, "trainer_process": 1.0, "engine_compiled": 12.5, "trainer_first_read": 13.0}
    assert list(timeline) == [hop for hop in startup.HOPS if hop in timeline]
    assert startup.startup_timeline({"startup/engine_compiled_t": 1.0}) == {}
