"""Driving the rollout stream to its end: ``rlax rollout`` stops by itself once every step of the run is
generated, and says so, loudly, when the stream stops making progress.

The driver submits the streaming pipeline and then watches the rollout store, once per
``loop.watch_interval_s`` (not the side input's ``loop.poll_interval_s``: a short refresh must not
shorten the stall window):

* every schedule step ``0 .. trainer.total_steps - 1`` complete in the store: cancel the job, exit 0;
* steps the newest weight version allows are waiting (``steps_to_generate``), no worker is busy (a
  fresh ``rlax_core.rollout.busy`` notice: compiling, generating), and no group was written and
  no step completed for ``loop.stall_polls`` such polls in a row: log why, write ``stream/stalled`` to
  the stream's metrics, cancel the job and exit ``EXIT_STALLED`` (``rlax launch`` restarts the rollout
  job on it; the restarted pipeline regenerates nothing that is already in the store);
* the job ends on its own (its impulses stop at ``loop.max_runtime_s``) or fails: exit 0 or raise.

Waiting for the trainer (no step allowed yet) and slow work in progress are not a stall: nothing is
counted then. Nor is start-up: each worker reports its phases as it passes them (image up, weights
loaded, engine compiled: ``rlax_core.utils.startup.WORKER_PHASES``), the driver logs them and writes
them to the stream's metrics, and stall polls count only once some worker's engine is compiled.
Start-up has its own budget, ``loop.startup_budget_s``; past it with no engine ready the driver logs
the phase the fleet was stuck in, writes ``stream/startup_overdue``, cancels the job and exits
``EXIT_STARTUP``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rlax_core.rollout.schedule import steps_to_generate
from rlax_core.utils import startup
from rlax_core.utils.metrics import MetricsWriter
from rlax_core.rollout.busy import busy_workers

log = logging.getLogger(__name__)

EXIT_STALLED = 3  # the rollout stream made no progress for loop.stall_polls polls (see rlax launch)
EXIT_STARTUP = 4  # no rollout worker had its engine compiled within loop.startup_budget_s


@dataclasses.dataclass
class StreamProgress:
    """What the store says about the stream at one poll."""

    groups_written: int
    steps_generated: int  # every step below this one is complete
    waiting: list[int]  # steps the newest version allows that are not complete yet
    latest_version: int | None

    @property
    def marker(self) -> tuple[int, int]:
        return self.groups_written, self.steps_generated


def read_progress(spec, weights, generated_below: int = 0) -> StreamProgress:
    """The stream's progress from the rollout store and the weight store (``generated_below``: a
    frontier known from an earlier poll; steps are never un-generated)."""
    store = spec.store()
    keys = store.list_groups()
    step = generated_below
    while step < spec.total_steps and store.is_step_complete(step, spec.prompts_per_step, keys):
        step += 1
    latest = weights.latest()
    waiting = []
    if latest is not None and step < spec.total_steps:
        allowed = steps_to_generate(latest, spec.max_staleness, spec.total_steps, set())
        waiting = [s for s in allowed if s >= step and not store.is_step_complete(s, spec.prompts_per_step, keys)]
    return StreamProgress(len(keys), step, waiting, latest)


class StreamWatch:
    """Counts polls without progress while work is waiting; writes the stream's metrics."""

    def __init__(self, spec, loop, metrics_dir: Path | None):
        from rlax_core.weights.store import WeightStore

        self.spec, self.loop = spec, loop
        self.weights = WeightStore(spec.weights)
        self.metrics = MetricsWriter(metrics_dir, tensorboard=False) if metrics_dir is not None else None
        self.idle_polls = 0
        self.busy = False
        self.polls = 0
        self.progress = StreamProgress(0, 0, [], None)
        # Start-up: until a worker's engine is compiled, polls count against loop.startup_budget_s, not
        # as stall polls. ``startup_phase``: how many of startup.WORKER_PHASES the furthest worker passed.
        self.started = time.monotonic()
        self.engine_ready = False
        self.startup_phase = 0
        self.workers_reporting = 0

    def close(self) -> None:
        self.weights.close()
        if self.metrics is not None:
            self.metrics.close()

    @property
    def finished(self) -> bool:
        return self.progress.steps_generated >= self.spec.total_steps

    @property
    def stalled(self) -> bool:
        return self.idle_polls >= self.loop.stall_polls

    @property
    def startup_overdue(self) -> bool:
        return not self.engine_ready and time.monotonic() - self.started > self.loop.startup_budget_s

    def startup_phase_name(self) -> str:
        return startup.WORKER_PHASES[self.startup_phase - 1][1] if self.startup_phase else startup.NO_WORKER_YET

    def startup_reason(self) -> str:
        return (f"rollout fleet start-up past loop.startup_budget_s={self.loop.startup_budget_s:g} s: no worker has "
                f"its engine compiled; the furthest of {self.workers_reporting} reporting worker(s) is at: "
                f"{self.startup_phase_name()}")

    def _follow_startup(self, moved: bool) -> None:
        phases = startup.worker_phases(self.spec.rollout_root, self.spec.run)
        self.workers_reporting = len(phases)
        furthest = max((passed for passed, _ in phases), default=0)
        if furthest > self.startup_phase:
            self.startup_phase = furthest
            log.info("rollout fleet start-up: %s (%.0f s, %d worker(s) reporting)", self.startup_phase_name(),
                     time.monotonic() - self.started, len(phases))
        self.engine_ready = moved or self.startup_phase == len(startup.WORKER_PHASES)

    def poll(self) -> StreamProgress:
        before = self.progress
        now = read_progress(self.spec, self.weights, before.steps_generated)
        self.polls += 1
        moved = now.marker != before.marker
        was_ready, phase_before = self.engine_ready, self.startup_phase
        if not self.engine_ready:
            self._follow_startup(moved)
        # Work in progress on a worker (a compilation, a long engine call) is not a stall, however slow;
        # nor is start-up: stall polls count once an engine is ready.
        self.busy = bool(now.waiting) and not moved and bool(busy_workers(self.spec.rollout_root, self.spec.run))
        counting = self.engine_ready and bool(now.waiting) and not moved
        self.idle_polls = self.idle_polls + (not self.busy) if counting else 0
        self.progress = now
        changed = self.engine_ready != was_ready or self.startup_phase != phase_before
        if moved or changed or self.stalled or self.startup_overdue or self.polls % 60 == 0:
            self._write()
        if self.idle_polls and self.idle_polls % max(1, self.loop.stall_polls // 4) == 0 and not self.stalled:
            log.warning("rollout stream: no group written for %d polls (%.0f s) while steps %s wait (weights "
                        "version %s)", self.idle_polls, self.idle_polls * self.loop.watch_interval_s, now.waiting,
                        now.latest_version)
        return now

    def stall_reason(self) -> str:
        p = self.progress
        return (f"rollout stream stalled: no rollout group written for {self.idle_polls} polls "
                f"({self.idle_polls * self.loop.watch_interval_s:.0f} s, loop.stall_polls={self.loop.stall_polls}) "
                f"while steps {p.waiting} wait for generation with weights version {p.latest_version} "
                f"({p.groups_written} groups and {p.steps_generated} of {self.spec.total_steps} steps generated)")

    def _write(self) -> None:
        if self.metrics is None:
            return
        p = self.progress
        self.metrics.write(p.steps_generated, {
            "stream/groups_written": p.groups_written, "stream/steps_generated": p.steps_generated,
            "stream/steps_waiting": len(p.waiting), "stream/idle_polls": self.idle_polls,
            "stream/stalled": int(self.stalled), "stream/latest_version": p.latest_version,
            "stream/workers_busy": int(self.busy),
            "stream/startup_phase": self.startup_phase, "stream/workers_reporting": self.workers_reporting,
            "stream/engine_ready": int(self.engine_ready), "stream/startup_overdue": int(self.startup_overdue),
            "stream/since_start_s": round(time.monotonic() - self.started, 1),
        })


def _state(result) -> str:
    with contextlib.suppress(Exception):  # a job service that went away reads as unknown, not a crash
        return str(result.state)
    return "UNKNOWN"


def _cancel(result, timeout_s: float = 60.0) -> None:
    from apache_beam.runners.runner import PipelineState

    with contextlib.suppress(Exception):
        result.cancel()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not PipelineState.is_terminal(_state(result)):
        time.sleep(0.5)


MARKS_GRACE_S = 30.0  # every group in (or trained on): the last steps' marks and metrics come a window or two later


def wait_for_step_marks(store, total_steps: int, *, timeout_s: float, running: Callable[[], bool],
                        poll_s: float = 0.1) -> list[int]:
    """The schedule steps below ``total_steps`` not yet marked generated when ``timeout_s`` has passed,
    or at once when ``running()`` turns false (the job that would mark them has ended).

    A step's groups land before its mark: the rollout stream writes the step's metrics with the mark a
    streaming window later (``transforms.step_marks``). Stopping the stream, or the job, as soon as
    the groups are in (or the trainer has taken them) would lose the last steps' metrics."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = sorted(set(range(total_steps)) - store.generated_steps())
        if not missing or not running() or time.monotonic() > deadline:
            return missing
        time.sleep(poll_s)


def drive(result, watch: StreamWatch, *, deadline_s: float) -> int:
    """Watch a submitted streaming job to its end (see the module docstring); returns the exit code."""
    from apache_beam.runners.runner import PipelineState

    spec, loop = watch.spec, watch.loop
    deadline = time.monotonic() + deadline_s
    try:
        while True:
            _exit_if_signalled()
            progress = watch.poll()
            if watch.finished:
                unmarked = wait_for_step_marks(
                    spec.store(), spec.total_steps, timeout_s=MARKS_GRACE_S,
                    running=lambda: not PipelineState.is_terminal(_state(result)))
                log.info("rollout stream: all %d steps generated (%d groups)%s; stopping the pipeline",
                         spec.total_steps, progress.groups_written,
                         f", steps {unmarked} still unmarked after {MARKS_GRACE_S:.0f} s" if unmarked else "")
                _cancel(result)
                return 0
            if watch.stalled:
                log.error("%s; cancelling the job (exit code %d)", watch.stall_reason(), EXIT_STALLED)
                _cancel(result)
                return EXIT_STALLED
            if watch.startup_overdue:
                log.error("%s; cancelling the job (exit code %d)", watch.startup_reason(), EXIT_STARTUP)
                _cancel(result)
                return EXIT_STARTUP
            state = _state(result)
            if PipelineState.is_terminal(state):
                if state == PipelineState.FAILED:
                    result.wait_until_finish()  # raises with the job's error
                    raise RuntimeError(f"the rollout pipeline failed (state {state})")
                log.warning("rollout stream ended (%s) with %d of %d steps generated", state,
                            progress.steps_generated, spec.total_steps)
                return 0
            if time.monotonic() > deadline:
                log.warning("rollout stream: loop.max_runtime_s passed with %d of %d steps generated; stopping",
                            progress.steps_generated, spec.total_steps)
                _cancel(result)
                return 0
            time.sleep(loop.watch_interval_s)
    except BaseException:
        _cancel(result, timeout_s=10)
        raise
    finally:
        watch.close()


def _quiet_harness_shutdown() -> None:
    """The job is over: the in-process SDK harness's threads lose their streams when Prism stops, and
    each would print a gRPC traceback (UNAVAILABLE, socket closed) that says nothing about the run."""
    import threading

    logging.getLogger("apache_beam.runners.worker").setLevel(logging.CRITICAL)
    threading.excepthook = lambda _args: None


_received_signal: int | None = None


def _exit_on_signal(signum, _frame):
    # The raise unwinds whatever the main thread is in. Python swallows an exception raised while a
    # gc callback or a __del__ runs (JAX registers one), so the signal is also remembered and ``drive``
    # exits on it at its next poll: a stop request is never lost.
    global _received_signal
    _received_signal = signum
    log.warning("rollout stream: received %s; stopping", signal.Signals(signum).name)
    sys.exit(128 + signum)


def _exit_if_signalled() -> None:
    if _received_signal is not None:
        log.warning("rollout stream: stopping on %s", signal.Signals(_received_signal).name)
        sys.exit(128 + _received_signal)


def run_stream(runner_args: Sequence[str], spec, loop, build: Callable[[Any, Any, Any], Any], *,
               metrics_dir: Path | None) -> int:
    """Build the stream with ``build(pipeline, spec, loop)``, run it on a Prism this process owns (when
    the runner is local Prism), drive it to its end; returns the exit code."""
    import apache_beam as beam

    from pipelines.runners import LocalPrism, cached_prism_binary, pipeline_options, runs_on_local_prism, scratch_dir

    args = list(runner_args)
    # SIGTERM (``rlax launch`` stopping us, a preemption) unwinds like Ctrl-C, so the job is cancelled,
    # Prism stopped and the scratch folder removed on the way out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with scratch_dir("rollout") as scratch:
        binary = cached_prism_binary()
        prism = LocalPrism(binary, scratch) if binary and runs_on_local_prism(args) else contextlib.nullcontext()
        with prism as server:
            if server is not None:
                args.append(f"--job_endpoint={server.endpoint}")
                startup.mark("prism_up")
            pipeline = beam.Pipeline(options=pipeline_options(args, streaming=True))
            build(pipeline, spec, loop)
            result = pipeline.run()
            startup.mark("job_submitted")
            startup.write_stamps(spec.rollout_root, spec.run, "driver")
            # The impulses stop at max_runtime_s; the job then drains. Allow it that long to do so.
            code = drive(result, StreamWatch(spec, loop, metrics_dir), deadline_s=loop.max_runtime_s + 120)
            _quiet_harness_shutdown()
    if code == EXIT_STALLED:
        # Job cancelled, Prism stopped, scratch removed. A stalled worker thread may still sit in native
        # code (a compilation, a hung call), and interpreter shutdown under it aborts (SIGABRT) instead
        # of exiting with our code: leave without waiting for it.
        logging.shutdown()
        os._exit(EXIT_STALLED)
    return code
