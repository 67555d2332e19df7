"""A stream that stops making progress says so (log + metrics), and `rlax launch` acts on it."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines.launch import start_command, wait_for_trainer
from pipelines.rl_stream import build_spec, load_configs
from pipelines.stream_watch import EXIT_STALLED, EXIT_STARTUP, StreamWatch, drive
from rlax_core.utils import startup
from rlax_core.utils.metrics import read_metrics
from rlax_core.weights import WeightStore

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "quickstart.yaml")


def _watch(tmp_path, stall_polls=3, startup_budget_s=600):
    overrides = [f"run.output_dir={tmp_path / 'run'}", "trainer.total_steps=2", "trainer.groups_per_step=2",
                 "trainer.max_staleness=0", f"loop.stall_polls={stall_polls}", "loop.poll_interval_s=0.01",
                 "loop.watch_interval_s=0.05", f"loop.startup_budget_s={startup_budget_s}",
                 f"loop.train_set={tmp_path / 'unused.jsonl'}"]
    run_config, loop = load_configs(CONFIG, overrides)
    spec = build_spec(run_config, 8)
    return spec, StreamWatch(spec, loop, tmp_path / "stream_metrics")


def _worker(spec, *, compile_s: float, steps_after: int = 0) -> subprocess.Popen:
    """A rollout worker process that reports its start-up as the real one does (image up, weights
    loaded), compiles its engine for ``compile_s`` seconds, then completes ``steps_after`` steps; returned
    once it has reported its weights loaded."""
    script = textwrap.dedent(f"""
        import time
        from rlax_core.data.rollout_store import RolloutStore
        from rlax_core.utils import startup
        startup.report_to({spec.rollout_root!r}, {spec.run!r}, "worker")
        startup.mark("worker_start")
        startup.mark("worker_model")
        time.sleep({compile_s})
        startup.mark("engine_compiled")
        for step in range({steps_after}):
            RolloutStore({spec.rollout_root!r}, {spec.run!r}).mark_step_generated(step)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    while not any(passed >= 2 for passed, _ in startup.worker_phases(spec.rollout_root, spec.run)):
        assert time.monotonic() < deadline and process.poll() in (None, 0), "the worker did not report its start-up"
        time.sleep(0.05)
    return process


class _RunningJob:
    """The submitted job's handle as the driver sees it: running until cancelled."""

    def __init__(self):
        self.cancelled = 0
        self.state = "RUNNING"

    def cancel(self):
        self.cancelled += 1
        self.state = "CANCELLED"


def test_a_start_up_slower_than_the_stall_window_is_neither_a_stall_nor_cancelled(tmp_path):
    # 3 stall polls of 0.05 s: the engine compiles for 40 of them, with steps waiting and no group written.
    spec, watch = _watch(tmp_path, stall_polls=3, startup_budget_s=120)
    _publish(spec, 0)
    worker = _worker(spec, compile_s=2.0, steps_after=2)
    job = _RunningJob()
    try:
        assert drive(job, watch, deadline_s=120) == 0
    finally:
        worker.kill()
    assert job.cancelled == 1 and worker.wait(timeout=30) is not None  # cancelled once, when every step was done
    rows = read_metrics(tmp_path / "stream_metrics")
    assert not any(row["stream/stalled"] for row in rows)
    assert [row["stream/startup_phase"] for row in rows if not row["stream/engine_ready"]][-1] == 2
    assert rows[-1]["stream/engine_ready"] == 1 and rows[-1]["stream/steps_generated"] == 2


def test_a_start_up_past_its_budget_is_reported_with_the_phase_it_was_stuck_in(tmp_path, caplog):
    spec, watch = _watch(tmp_path, stall_polls=3, startup_budget_s=1.5)
    watch.close()
    _publish(spec, 0)
    worker = _worker(spec, compile_s=600)
    spec, watch = _watch(tmp_path, stall_polls=3, startup_budget_s=1.5)  # its budget starts now
    job = _RunningJob()
    try:
        assert drive(job, watch, deadline_s=120) == EXIT_STARTUP
    finally:
        worker.kill()
    assert job.cancelled == 1
    assert "start-up past loop.startup_budget_s=1.5 s" in caplog.text
    assert "weights loaded: the engine is compiling" in caplog.text
    rows = read_metrics(tmp_path / "stream_metrics")
    assert rows[-1]["stream/startup_overdue"] == 1 and rows[-1]["stream/startup_phase"] == 2
    assert not any(row["stream/stalled"] for row in rows)


def test_a_fleet_with_no_worker_up_says_so(tmp_path):
    spec, watch = _watch(tmp_path, startup_budget_s=0.2)
    try:
        watch.poll()
        time.sleep(0.3)
        watch.poll()
        assert watch.startup_overdue and "no worker process up yet" in watch.startup_reason()
    finally:
        watch.close()


def _publish(spec, version):
    with WeightStore(spec.weights) as store:
        store.publish(version, {"w": np.full(4, version, np.float32)}, process_index=0, process_count=1)


def test_waiting_for_the_trainer_is_not_a_stall_but_waiting_steps_without_progress_are(tmp_path, caplog):
    spec, watch = _watch(tmp_path, stall_polls=3)
    assert _worker(spec, compile_s=0).wait(timeout=60) == 0  # a worker up with its engine compiled
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
    from rlax_core.rollout.busy import Busy, busy_workers

    spec, watch = _watch(tmp_path, stall_polls=2)
    assert _worker(spec, compile_s=0).wait(timeout=60) == 0  # an engine is ready: stall polls count
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


def test_a_sigterm_swallowed_where_it_landed_still_stops_the_stream(tmp_path, monkeypatch):
    # Python ignores an exception raised while a gc callback runs (JAX registers one): a SIGTERM whose
    # SystemExit lands there must still stop the driver, which cancels the job on its way out.
    import gc
    import signal

    from pipelines import stream_watch

    monkeypatch.setattr(stream_watch, "_received_signal", None)
    previous = signal.signal(signal.SIGTERM, stream_watch._exit_on_signal)

    def signal_inside_gc(phase, _info):
        if phase == "start":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs (and its SystemExit is swallowed) here

    gc.callbacks.append(signal_inside_gc)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(signal_inside_gc)
        signal.signal(signal.SIGTERM, previous)
    assert stream_watch._received_signal == signal.SIGTERM  # the unwinding was lost; the request is not
    _spec, watch = _watch(tmp_path)
    job = _RunningJob()
    with pytest.raises(SystemExit) as stopped:
        drive(job, watch, deadline_s=60)
    assert stopped.value.code == 128 + signal.SIGTERM and job.cancelled == 1


def test_the_launch_sees_the_trainer_end_at_once_not_at_its_next_poll(tmp_path, monkeypatch):
    import types

    import pipelines.launch

    def no_sleep(seconds):
        raise AssertionError(f"the launch slept {seconds} s instead of waiting on the trainer")

    # The launch's clock without a sleep: its pause between polls must be a wait on the trainer's process.
    monkeypatch.setattr(pipelines.launch, "time", types.SimpleNamespace(monotonic=time.monotonic, time=time.time,
                                                                        sleep=no_sleep))
    rollout = start_command("rollout", [sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "logs")
    trainer = start_command("trainer", [sys.executable, "-c", "import time; time.sleep(0.5)"], tmp_path / "logs")
    try:
        wait_for_trainer(trainer, rollout, total_steps=1, metrics_dir=tmp_path / "metrics", timeout_s=600, poll_s=300)
        assert trainer.popen.returncode == 0  # returned on the trainer's exit, inside the first poll's pause
    finally:
        rollout.stop(5)
        trainer.stop(5)


def test_the_last_steps_marks_are_waited_for_while_their_job_runs(tmp_path):
    """A step's groups land before its mark, which carries its metrics: the stream (before it cancels
    itself) and the launch (before it stops the rollout job) wait for the marks, boundedly, while the
    job that would write them runs."""
    from pipelines.stream_watch import wait_for_step_marks
    from rlax_core.data.rollout_store import RolloutStore

    store = RolloutStore(tmp_path / "rollouts", "run")
    store.mark_step_generated(0)
    marks_step_1 = textwrap.dedent(f"""
        import time
        from rlax_core.data.rollout_store import RolloutStore
        time.sleep(1)
        RolloutStore({str(tmp_path / "rollouts")!r}, "run").mark_step_generated(1)
        time.sleep(300)
    """)
    rollout = start_command("rollout", [sys.executable, "-c", marks_step_1], tmp_path / "logs")
    running = lambda: rollout.popen.poll() is None  # noqa: E731
    try:
        assert wait_for_step_marks(store, 2, timeout_s=120, running=running) == []
        assert store.generated_steps() == {0, 1}
        assert wait_for_step_marks(store, 4, timeout_s=0.3, running=running) == [2, 3]  # the grace is bounded
    finally:
        rollout.stop(5)
    assert wait_for_step_marks(store, 3, timeout_s=120, running=running) == [2]  # an ended job marks nothing more
