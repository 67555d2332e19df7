"""``rlax launch``: the trainer job and the rollout pipeline together on this machine.

    rlax launch --config configs/quickstart.yaml --train-set runs/quickstart/filtered --output runs/launch

Starts ``rlax train`` and ``rlax rollout`` as two processes (each in its own process group, logs
under ``OUTPUT/logs/``; both die with the launch, however it dies: ``pipelines.lifeline``), waits until the trainer has finished ``trainer.total_steps`` steps, then
stops the rollout pipeline (SIGTERM, then SIGKILL after a grace period) and writes the loop's
per-step metrics (``OUTPUT/loop/metrics.jsonl`` + TensorBoard), joining the trainer's metrics with
the rollout side's: reward, pass rate, response length, staleness histogram, stale drops, rollout
and train time, trainer idle fraction, tokens/s, mismatch KL. A process that dies early stops the
other and fails the launch in one line: which job, the cause read from its log (``pipelines.failures``)
and the log's path; so does ``--timeout-s``.

A recipe that names ``stages`` (``curate -> rft -> sft -> filter -> rl -> evaluate``) runs them in
order, each by its own job, this launch being the ``rl`` stage (``pipelines.launch_stages``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

HELP = "run the trainer and the rollout pipeline together on this machine"

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 15.0  # how often the launch reports the trainer's steps when no progress bar is shown


@dataclasses.dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log_path: Path
    command: Sequence[str] = ()  # what ``start`` ran: ``restart`` runs it again
    restarts: int = 0

    def restart(self) -> None:
        """Stop what is left of the process and start it again, appending to the same log."""
        from pipelines.lifeline import spawn_job

        self.stop(grace_s=10)
        self.popen = spawn_job(self.command, self.log_path, append=True)
        self.restarts += 1

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; returns the exit code."""
        if self.popen.poll() is None:
            _signal_group(self.popen, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s of SIGTERM; killing it", self.name, grace_s)
                _signal_group(self.popen, signal.SIGKILL)
                self.popen.wait(timeout=30)
        else:
            _signal_group(self.popen, signal.SIGKILL)  # children it may have left (Prism, workers)
        return self.popen.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass


def start(name: str, argv: Sequence[str], log_dir: Path) -> Process:
    """``rlax ARGV`` as a job owned by the launch (``lifeline.spawn_job``), output to ``log_dir/NAME.log``."""
    from pipelines.lifeline import cli_command

    return start_command(name, cli_command(argv), log_dir)


def start_command(name: str, command: Sequence[str], log_dir: Path) -> Process:
    """``command`` as a job owned by the launch, output to ``log_dir/NAME.log``."""
    from pipelines.lifeline import spawn_job

    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    return Process(name, spawn_job(command, log_path, append=True), log_path, tuple(command))


def trainer_argv(config: str | None, run_overrides: Sequence[str]) -> list[str]:
    return ["train", *(["--config", config] if config else []), *run_overrides]


def rollout_argv(config: str | None, overrides: Sequence[str], train_set: str, beam_args: Sequence[str]) -> list[str]:
    return ["rollout", *(["--config", config] if config else []), "--train-set", train_set, *overrides, *beam_args]


def trainer_metrics_dir(run_config) -> str:
    return run_config.metrics_dir()


def log_dir(run_config) -> Path:
    """The two processes' logs: under the run's output when it is a local folder, else ``runs/NAME/logs``."""
    from rlax_core.utils.paths import is_remote

    output = run_config.run.output_dir
    return (Path("runs") / run_config.run.name if is_remote(output) else Path(output)) / "logs"


def wait_for_trainer(trainer: Process, rollout: Process, *, total_steps: int, metrics_dir: str, timeout_s: float,
                     poll_s: float = 2.0, max_rollout_restarts: int = 0, run_paths: Sequence[str] = ()) -> None:
    """Until the trainer exits 0; raise if the trainer fails, or the timeout passes.

    A rollout job that exits because its stream stalled (``EXIT_STALLED``) or failed (any other
    non-zero exit: a worker error, a crashed local runner) is restarted, at most
    ``max_rollout_restarts`` times in all: its writes are idempotent and a restarted stream skips what
    is in the store, so nothing is generated twice. After that the run stops with the last reason.
    One that exits 0 has generated every step. A job that failed because a disk or quota ran out
    is named first, with the path (its own, or the first of ``run_paths`` that is full): ``ResourceError``.
    """
    from pipelines.failures import JobFailed, job_failed
    from pipelines.stream_watch import EXIT_STALLED

    from rlax_core.utils.logging import progress, show_progress
    from rlax_core.utils.metrics import read_metrics

    started = time.monotonic()
    deadline, report_at = started + timeout_s, started + PROGRESS_EVERY_S
    bar = iter(progress(range(total_steps), desc="trainer steps", total=total_steps, unit="step"))
    shown = 0
    while True:
        code = trainer.popen.poll()
        steps = len({row["step"] for row in read_metrics(metrics_dir) if "step" in row})
        while shown < min(steps, total_steps):
            next(bar, None)
            shown += 1
        if not show_progress() and time.monotonic() > report_at:  # no bar off a terminal: a log line instead
            report_at += PROGRESS_EVERY_S
            log.info("launch: %d of %d trainer steps after %.0f s", steps, total_steps, time.monotonic() - started)
        if code is not None:
            if code != 0:
                raise_resource_failure(trainer, run_paths)
                raise job_failed(trainer.name, code, trainer.log_path)
            return
        rollout_code = rollout.popen.poll()
        if rollout_code is not None and rollout_code != 0:
            raise_resource_failure(rollout, run_paths)  # a restart would meet the same full disk
            stalled = rollout_code == EXIT_STALLED
            reason = (f"{stall_reason(rollout)}; its log: {rollout.log_path}" if stalled else
                      str(job_failed(rollout.name, rollout_code, rollout.log_path)))
            if rollout.restarts >= max_rollout_restarts:
                what = "stalled" if stalled else "failed"
                raise JobFailed(f"the rollout pipeline {what} {rollout.restarts + 1} time(s), giving up: {reason}")
            log.error("launch: %s; restarting the rollout job (restart %d of at most %d)", reason,
                      rollout.restarts + 1, max_rollout_restarts)
            rollout.restart()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the trainer did not finish {total_steps} steps within {timeout_s:.0f} s "
                               f"({steps} done); see {trainer.log_path} and {rollout.log_path}")
        try:  # the poll's pause ends the moment the trainer exits: the run's end waits for nothing
            trainer.popen.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass


def raise_resource_failure(process: Process, run_paths: Sequence[str] = ()) -> None:
    """Raise ``ResourceError`` (one line: what ran out, the path, the job) when the failed job's log
    says a disk or quota ran out; a full disk otherwise reads as "exited with code 1"."""
    from rlax_core.utils.resources import ResourceError, resource_failure_in_log

    line = resource_failure_in_log(process.tail(200), run_paths)
    if line is not None:
        raise ResourceError(f"the {process.name} job (pid {process.popen.pid}) failed: {line}; its log: "
                            f"{process.log_path}")


def stall_reason(process: Process) -> str:
    """The stall line the rollout job logged last (``pipelines.stream_watch``), or what its log ends with."""
    lines = process.tail(200).splitlines()
    stalls = [line for line in lines if "rollout stream stalled" in line]
    return (stalls[-1] if stalls else (lines[-1] if lines else "no log")).strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-set", help="training prompts for the rollout pipeline (overrides loop.train_set)")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="fail if the trainer is not done by then")
    parser.add_argument("--stop-grace-s", type=float, default=30.0, help="SIGTERM-to-SIGKILL grace when stopping")
    parser.add_argument("--max-rollout-restarts", type=int, default=2,
                        help="restart a stalled rollout job this many times, then stop the run with the reason")
    parser.add_argument("--output", help="the run's folder (overrides run.output_dir); with --rehearse, where the "
                        "rehearsal's outputs go (local or gs://)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run already in the output folder (a folder holding files is refused "
                             "otherwise); a staged recipe skips the stages already done")
    parser.add_argument("--dry-run", action="store_true",
                        help="print a staged recipe's plan (each stage's command, inputs and outputs) and run nothing")
    from pipelines.rehearse import add_arguments as add_rehearsal_arguments

    add_rehearsal_arguments(parser)


def launch(config: str | None, overrides: Sequence[str], beam_args: Sequence[str], *, train_set: str | None = None,
           timeout_s: float = 3600.0, stop_grace_s: float = 30.0, max_rollout_restarts: int = 2,
           resume: bool = False) -> dict[str, str]:
    """Run both jobs to the end; returns where the run's outputs are.

    The output folder (``run.output_dir``) must be new or empty unless ``resume``: then the trainer
    resumes from its newest checkpoint and the rollout pipeline skips the steps already written.
    """
    launched_at = time.time()
    from rlax_core.utils.paths import join
    from pipelines.config import find_config
    from pipelines.plan import check_memory
    from pipelines.initial_policy import prepare_policy
    from pipelines.inputs import require_examples, require_model
    from pipelines.rl_stream import load_configs
    from pipelines.run_folder import claim

    overrides = list(overrides)
    if train_set:
        overrides.append(f"loop.train_set={train_set}")
    config = str(find_config(config).resolve()) if config else None  # the jobs may start in another folder
    run_config, loop = load_configs(config, overrides)
    loop.require_train_set()
    # Both jobs would fail on these inputs, each in its own log; say it once, before starting either.
    require_model(run_config.model.resolved_path())
    require_examples(loop.train_set)
    check_memory(run_config)  # both roles run here: refuse before either starts
    if claim(run_config.run.output_dir, resume=resume, flag="run.output_dir"):
        log.info("launch: resuming the run in %s", run_config.run.output_dir)
    prepare_policy(run_config)  # once, here: both jobs then read the same upcycled policy
    run_overrides = [o for o in overrides if not o.startswith("loop.")]
    output = run_config.run.output_dir
    logs = log_dir(run_config)
    trainer = start("trainer", trainer_argv(config, run_overrides), logs)
    rollout = start("rollout", rollout_argv(config, overrides, loop.train_set, beam_args), logs)
    spawned_at = time.time()
    started = time.monotonic()
    from rlax_core.data.rollout_store import RolloutStore

    store = RolloutStore(run_config.rollout_root(), run_config.run.name)
    try:
        wait_for_trainer(trainer, rollout, total_steps=run_config.trainer.total_steps,
                         metrics_dir=trainer_metrics_dir(run_config), timeout_s=timeout_s,
                         max_rollout_restarts=max_rollout_restarts,
                         run_paths=[output, run_config.weight_store().root, run_config.rollout_root(),
                                    trainer_metrics_dir(run_config), str(logs)])
        from pipelines.stream_watch import MARKS_GRACE_S, wait_for_step_marks

        unmarked = wait_for_step_marks(store, run_config.trainer.total_steps, timeout_s=MARKS_GRACE_S,
                                       running=lambda: rollout.popen.poll() is None)
        if unmarked:
            log.warning("launch: the rollout job had not marked steps %s generated %.0f s after the trainer's "
                        "last step: the loop metrics lack their rollout side", unmarked, MARKS_GRACE_S)
    finally:
        for process in (rollout, trainer):
            process.stop(stop_grace_s)
    log.info("launch: %d trainer steps in %.1f s", run_config.trainer.total_steps, time.monotonic() - started)
    from rlax_core.rollout.loop_metrics import loop_metrics, write_loop_metrics

    loop_dir = run_config.loop_metrics_dir()
    rows = loop_metrics(trainer_metrics_dir(run_config), store, {"launch": launched_at, "launch_spawned": spawned_at})
    write_loop_metrics(rows, loop_dir)
    return {
        "metrics": join(loop_dir, "metrics.jsonl"),
        "trainer_metrics": trainer_metrics_dir(run_config),
        "tensorboard": join(loop_dir, "tensorboard"),
        "checkpoints": join(output, "checkpoints"),
        "weights": run_config.weight_store().root,
        "rollouts": run_config.rollout_root(),
        "logs": str(logs),
    }


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    if args.rehearse:
        from pipelines.rehearse import run_from_args

        return run_from_args(args, beam_args, launch)  # the loop stage is this module's launch()
    from rlax_core.config import require
    from pipelines.run_folder import claim

    require(args.timeout_s > 0, "--timeout-s", f"seconds > 0, got {args.timeout_s:g}")
    require(args.stop_grace_s >= 0, "--stop-grace-s", f"seconds >= 0, got {args.stop_grace_s:g}")
    require(args.max_rollout_restarts >= 0, "--max-rollout-restarts", f">= 0, got {args.max_rollout_restarts}")
    # Before the config's imports (a minute on a busy machine): the output and input named on the command line.
    overrides = list(args.overrides)
    if args.output:
        if not args.dry_run:  # a dry run writes nothing, not even the folder
            claim(args.output, resume=args.resume)
        overrides.append(f"run.output_dir={args.output}")
    from pipelines.config import load_run_config
    from pipelines.launch_stages import staged

    if staged(load_run_config(args.config, overrides).stages):  # each stage its job; launch() is the rl stage
        return run_staged(args, beam_args, overrides)
    require(not args.dry_run, "--dry-run", "prints a staged recipe's plan, and this recipe names no stages: "
            "rlax launch runs the trainer and the rollout stream in run.output_dir")
    if args.train_set:
        from pipelines.inputs import require_input  # Beam's file systems read local and gs:// alike

        require_input(args.train_set, "train set")
    where = launch(args.config, overrides, beam_args, train_set=args.train_set, timeout_s=args.timeout_s,
                   stop_grace_s=args.stop_grace_s, max_rollout_restarts=args.max_rollout_restarts,
                   resume=args.resume or bool(args.output))
    width = max(map(len, where))
    print("rlax launch: done.")
    for name, path in where.items():
        print(f"  {name:<{width}}  {path}")
    return 0


def run_staged(args: argparse.Namespace, beam_args: list[str], overrides: list[str]) -> int:
    """``rlax launch`` of a recipe that names stages (``pipelines.launch_stages``): the plan, printed
    with ``--dry-run``, else run stage by stage, :func:`launch` the rl stage."""
    from rlax_core.config import ConfigError, require
    from pipelines.config import find_config, load_run_config
    from pipelines.launch_stages import describe, output_root, plan, run_stages
    from pipelines.run_folder import claim

    require(args.config is not None, "--config", "a staged run needs its recipe: give --config RECIPE")
    if args.train_set:
        raise ConfigError("--train-set", "a staged run trains on its own stages' prompts (curate, filter); "
                          "drop --train-set, or name only the rl stage")
    config = str(find_config(args.config).resolve())  # the stages' jobs may start in another folder
    stages = plan(config, overrides)
    if args.dry_run:
        print("\n".join(describe(stages, args.config)))
        return 0
    run_config = load_run_config(config, overrides)
    if not args.output:  # the command line's --output was claimed before the config loaded
        claim(output_root(run_config), resume=args.resume, flag="run.output_dir")
    seconds = run_stages(stages, config, log_dir(run_config), run_loop=launch, beam_args=beam_args,
                         timeout_s=args.timeout_s, stop_grace_s=args.stop_grace_s,
                         max_rollout_restarts=args.max_rollout_restarts)
    ran = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()) or "none ran"
    print(f"rlax launch: every stage done ({ran}).")
    for stage in stages:
        for what, path in stage.outputs:
            print(f"  {stage.name:<9} {what:<14} {path}")
    return 0
