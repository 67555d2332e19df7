"""``rlax rollout``: the rollout fleet, a Beam streaming pipeline.

    rlax rollout --config configs/quickstart.yaml --train-set runs/quickstart/filtered loop.sampling.samples_per_prompt=8

One watcher drives it (``transforms.live_side_input.WatchValue``): it reads the weight store's newest
committed version every ``loop.poll_interval_s`` and emits it, as the slowly updating side input and
as a tick of the main input, when it changes (and every ``loop.heartbeat_s``). On each tick the
prompt schedule emits the steps that version allows, the engine (one per worker process) generates
them with the latest weights, the task's verifier scores them, and every group is written to the
rollout store under its idempotent name. Locally it runs on Prism (the default
streaming runner, see ``pipelines.runners``); on Dataflow the same pipeline runs with
``--runner DataflowRunner --streaming --enable_streaming_engine`` and accelerator workers
(``configs/qwen25_7b_math_dataflow_tpu.yaml`` documents the options).

The pipeline ends by itself once every step of ``trainer.total_steps`` is generated (or after
``--max-runtime-s``), and exits 3 when its stream stalls (``pipelines.stream_watch``); ``rlax launch``
also stops it when the trainer is done. Locally it runs on a Prism it owns, which dies with it.

Settings of the loop that no other section owns live under ``loop.`` overrides (see ``LoopConfig``).
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Sequence

from rlax_core.rollout.config import LoopConfig

HELP = "Beam streaming: generate and score rollouts with the latest weights"

log = logging.getLogger(__name__)


def load_configs(config_path: str | None, overrides: Sequence[str]):
    """(RunConfig, its ``loop:`` section) from a run config file and dotted overrides; refused (ConfigError)
    when the loop names no reward, or a distillation teacher whose tokenizer is not the policy's,
    before anything starts."""
    from pipelines.config import load_run_config

    from rlax_core.rewards.distillation import check_teacher

    run_config = load_run_config(config_path, overrides)
    check_teacher(run_config.model.resolved_path(), run_config.loop.named_rewards().distillation,
                  "loop.rewards.distillation.teacher")  # a teacher of another tokenizer: refused before anything starts
    return run_config, run_config.loop


def build_spec(run_config, train_set_size: int, job: str = ""):
    """The rollout workers' spec: the run's sections and the training set's path (its rows stay in
    storage); ``job`` names this job's claims on steps (``RolloutSpec.job``)."""
    from rlax_core.rollout.spec import RolloutSpec

    return RolloutSpec(
        run=run_config.run.name, run_seed=run_config.run.seed, model_path=run_config.policy_path(),
        model_dtype=run_config.model.dtype, train_set_size=train_set_size, rollout_root=run_config.rollout_root(),
        weights=run_config.weight_store(), engine=run_config.engine, loop=run_config.loop, trainer=run_config.trainer,
        algorithm=run_config.algorithm, compilation_cache=run_config.run.compilation_cache, compilation_cache_dir=run_config.run.compilation_cache_dir,
        job=job)


class _LatestVersion:
    """Picklable ``read()`` of the side input: the weight store's newest committed version."""

    def __init__(self, weights_config):
        self._config = weights_config
        self._store = None

    def __call__(self):
        if self._store is None:
            from rlax_core.weights.store import WeightStore

            self._store = WeightStore(self._config)
        return self._store.latest()


def build(pipeline, spec, loop: LoopConfig, start: float | None = None):
    """Wire the streaming pipeline onto ``pipeline``; returns the PCollection of finished steps."""
    from transforms.live_side_input import WatchValue
    from transforms.rollout import RolloutStream

    start = time.time() if start is None else start
    stop = start + loop.max_runtime_s
    ticks, latest = pipeline | "LatestVersion" >> WatchValue(
        _LatestVersion(spec.weights), loop.poll_interval_s, heartbeat_s=loop.heartbeat_s, start=start, stop=stop)
    return (ticks, latest) | "RolloutStream" >> RolloutStream(spec)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-set", help="parquet file/folder or .jsonl of Example rows (overrides loop.train_set)")
    parser.add_argument("--max-runtime-s", type=float, help="stop the pipeline after this many seconds")


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from rlax_core.utils import startup
    from pipelines.plan import check_memory

    startup.mark_process_start("rollout")
    from pipelines.beam_args import merge_beam_args

    overrides = list(args.overrides)
    if args.train_set:
        overrides.append(f"loop.train_set={args.train_set}")
    if args.max_runtime_s is not None:  # 0 and negatives are refused by LoopConfig, not ignored
        overrides.append(f"loop.max_runtime_s={args.max_runtime_s}")
    run_config, loop = load_configs(args.config, overrides)
    check_memory(run_config, roles=("rollout",))
    from rlax_core.utils.compile_cache import enable_compilation_cache

    # The in-process (loopback) workers compile here; remote ones configure their own from the spec.
    enable_compilation_cache(run_config.run.compilation_cache_dir, enabled=run_config.run.compilation_cache)
    loop.require_train_set()
    from pipelines.dataflow_job import is_dry_run, print_dry_run
    from pipelines.runners import pipeline_options

    # Unless the config or the command line names a runner, pipeline_options picks Prism (a live one).
    runner_args = merge_beam_args(run_config.beam.args("rollout"), beam_args)
    if not any(a.startswith(("--job_server_timeout", "--job-server-timeout")) for a in runner_args):
        # The portable runner's job state and message streams die at this gRPC deadline (300 s by
        # default), which tears down a long-running local streaming pipeline; outlive the run instead.
        runner_args.append(f"--job_server_timeout={int(loop.max_runtime_s) + 600}")
    options = pipeline_options(runner_args, streaming=True)
    if is_dry_run(options):  # translate for Dataflow against the recipe's paths, read nothing, submit nothing
        spec = build_spec(run_config, train_set_size=0)
        return print_dry_run("rollout", options, lambda pipeline: build(pipeline, spec, loop),
                             [f"train set {loop.train_set}"])
    from rlax_core.data.training_set import read_examples

    examples = read_examples(loop.train_set)
    import uuid

    from pipelines.initial_policy import prepare_policy

    prepare_policy(run_config)  # the engine's architecture and tokenizer: made here when no job has yet

    spec = build_spec(run_config, len(examples), job=uuid.uuid4().hex[:12])  # a restart's claims start afresh
    startup.mark("rollout_imports")
    log.info("rollout: %d training prompts, %d steps x %d prompts x %d samples, k=%d, store %s",
             len(examples), spec.total_steps, spec.prompts_per_step, loop.sampling.samples_per_prompt, spec.max_staleness,
             spec.rollout_root)
    from pathlib import Path

    from pipelines.stream_watch import run_stream

    from rlax_core.utils.paths import is_remote

    metrics_dir = None if is_remote(run_config.run.output_dir) else Path(run_config.run.output_dir) / "stream_metrics"
    return run_stream(runner_args, spec, loop, build, metrics_dir=metrics_dir)
