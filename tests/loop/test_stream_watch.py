"""A stream that stops making progress says so (log + metrics), and `rlax launch` acts on it."""

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipelines.launch import start_command, wait_for_trainer
from pipelines.rl_stream import build_spec, load_configs
from pipelines.stream_watch import EXIT_STALLED, StreamWatch
from rlax_core.utils.metrics import read_metrics
from rlax_core.weights import WeightStore

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "quickstart.yaml")


def _watch(tmp_path, stall_polls=3):
    overrides = [f"run.output_dir={tmp_path / 'run'}", "trainer.total_steps=2", "trainer.groups_per_step=2",
                 "trainer.max_staleness=0", f"loop.stall_polls={stall_polls}", "loop.poll_interval_s=0.01",
                 "loop.watch_interval_s=0.01",
                 f"loop.train_set={tmp_path / 'unused.jsonl'}"]
    run_config, loop = load_configs(CONFIG, overrides)
    spec = build_spec(run_config, 8)
    return spec, StreamWatch(spec, loop, tmp_path / "stream_metrics")


def _publish(spec, version):
    with WeightStore(spec.weights) as store:
        store.publish(version, {"w": np.full(4, version, np.float32)}, process_index=0, process_count=1)


def test_waiting_for_the_trainer_is_not_a_stall_but_waiting_steps_without_progress_are(tmp_path, caplog):
    spec, watch = _watch(tmp_path, stall_polls=3)
    try:
        for _ in range(5):  # nothing published: no step may be generated yet
            assert watch.poll().waiting == [] and not watch.stalled
        _publish(spec, 0)
        for _ in range(2):
            watch.poll()
        assert watch.idle_polls == 2 and not watch.stalled
        assert watch.poll().waiting == [0] and watch.stalled
        assert "no rollout group written for 3 polls" in watch.stall_reason()
        assert "steps [0] wait" in watch.stall_reason()
        spec.store().mark_step_generated(0)  # progress: the counter starts again
        progress = watch.poll()
        assert progress.steps_generated == 1 and progress.waiting == [] and watch.idle_polls == 0
        _publish(spec, 1)
        assert watch.poll().waiting == [1] and watch.idle_polls == 1
        spec.store().mark_step_generated(1)
        watch.poll()
        assert watch.finished
    finally:
        watch.close()
    rows = read_metrics(tmp_path / "stream_metrics")
    assert any(row["stream/stalled"] == 1 and row["stream/steps_waiting"] == 1 for row in rows)
    assert rows[-1]["stream/steps_generated"] == 2 and rows[-1]["stream/stalled"] == 0


def _stalling_rollout(tmp_path, stalls_before_success, exit_code=EXIT_STALLED):
    """A rollout job that stalls (exit EXIT_STALLED, the stall line in its log), or fails with
    ``exit_code``, on its first runs."""
    counter = tmp_path / "runs"
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        counter = Path({str(counter)!r})
        runs = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(runs))
        if runs <= {stalls_before_success}:
            print("ERROR rollout stream stalled: no rollout group written for 3 polls, run", runs, flush=True)
            sys.exit({exit_code})
    """)
    return start_command("rollout", [sys.executable, "-c", script], tmp_path / "logs"), counter


def _trainer(tmp_path, runs_file, until_runs):
    """A trainer job that finishes once the rollout job has run ``until_runs`` times (at most 120 s)."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        deadline = time.monotonic() + 120
        while not (Path({str(runs_file)!r}).exists() and Path({str(runs_file)!r}).read_text() == "{until_runs}"):
            if time.monotonic() > deadline:
                sys.exit(1)
            time.sleep(0.05)
    """)
    return start_command("trainer", [sys.executable, "-c", script], tmp_path / "logs")


def _launch_until_done(tmp_path, failures: int, until_runs: int, restarts: int, exit_code=EXIT_STALLED):
    """``wait_for_trainer`` over a rollout job that fails ``failures`` times and a trainer that ends
    once the rollout job has run ``until_runs`` times; returns (rollout process, its run counter)."""
    rollout, runs = _stalling_rollout(tmp_path, stalls_before_success=failures, exit_code=exit_code)
    trainer = _trainer(tmp_path, runs, until_runs=until_runs)
    try:
        wait_for_trainer(trainer, rollout, total_steps=1, metrics_dir=tmp_path / "metrics", timeout_s=120,
                         poll_s=0.1, max_rollout_restarts=restarts)
    finally:
        rollout.stop(5)
        trainer.stop(5)
    return rollout, runs


def test_launch_restarts_a_stalled_rollout_job(tmp_path):
    rollout, runs = _launch_until_done(tmp_path, failures=2, until_runs=3, restarts=2)
    assert rollout.restarts == 2 and runs.read_text() == "3"


def test_launch_restarts_a_failed_rollout_job_and_gives_up_with_its_log_after_the_budget(tmp_path):
    rollout, runs = _launch_until_done(tmp_path, failures=1, until_runs=2, restarts=1, exit_code=1)  # a crashed runner
    assert rollout.restarts == 1 and runs.read_text() == "2"
    with pytest.raises(RuntimeError, match=r"failed 2 time\(s\), giving up: .*exited with code 1"):
        _launch_until_done(tmp_path / "again", failures=5, until_runs=99, restarts=1, exit_code=1)


def test_launch_stops_the_run_with_the_reason_when_the_rollout_keeps_stalling(tmp_path):
    with pytest.raises(RuntimeError, match=r"stalled 2 time\(s\), giving up: .*no rollout group written .* run 2"):
        _launch_until_done(tmp_path, failures=5, until_runs=99, restarts=1)
    assert (tmp_path / "runs").read_text() == "2"


def test_a_busy_worker_is_slow_work_not_a_stall(tmp_path):
    from transforms.worker_heartbeat import Busy, busy_workers

    spec, watch = _watch(tmp_path, stall_polls=2)
    try:
        _publish(spec, 0)
        with Busy(spec.rollout_root, spec.run, "compiling the engine", interval_s=0.05):
            assert [b["what"] for b in busy_workers(spec.rollout_root, spec.run)] == ["compiling the engine"]
            for _ in range(5):
                watch.poll()
            assert watch.busy and watch.idle_polls == 0 and not watch.stalled
        assert busy_workers(spec.rollout_root, spec.run) == []  # removed when the work ends
        watch.poll()
        watch.poll()
        assert not watch.busy and watch.stalled
    finally:
        watch.close()
    assert busy_workers(spec.rollout_root, spec.run, fresh_s=0.0) == []


@pytest.mark.parametrize("field", ["watch_interval_s", "poll_interval_s"])
def test_the_watch_and_refresh_intervals_are_checked_on_construction(field):
    from rlax_core.rollout import LoopConfig
    from rlax_core.config import ConfigError

    with pytest.raises(ConfigError, match=field):
        LoopConfig(**{field: 0})
