"""``rlax train``: the JAX trainer job. Learns from rollout groups, publishes weight versions.

    rlax train --config configs/quickstart.yaml trainer.total_steps=50 trainer.checkpoint_every=5

Reads (all from the run config, ``pipelines.config.RunConfig``):

    model.path, model.dtype   the initial policy (and the KL reference): HF folder or llama2.c .bin
    algorithm                 the objective (rlax_core.rl; ``preset: grpo`` + overrides)
    trainer                   rlax_core.training.TrainerConfig: optimizer, mesh, groups_per_step,
                              ppo_epochs, mini_batches, micro_batches, value_model (PPO's critic),
                              max_seq_len, total_steps, max_staleness, checkpoint_every,
                              keep_checkpoints, wait_timeout_s, ...
    run.name, run.output_dir  where everything lives:

    OUTPUT/rollouts/RUN/step_XXXXXXXX/group_XXXXX.parquet   input  (rlax_core.data.rollout_store)
    OUTPUT/weights/                                         output (rlax_core.weights; ``weights:``)
    OUTPUT/checkpoints/N/                                   orbax: state + data ledger
    OUTPUT/hf/step_XXXXXXXX/                                Hugging Face folders: the last step, and
                                                            every ``trainer.export_every`` steps
    OUTPUT/weights/model/, OUTPUT/checkpoints/model/        model templates (config, tokenizer), with
                                                            which ``rlax evaluate`` reads versions
    OUTPUT/metrics/metrics.jsonl, OUTPUT/metrics/tensorboard/
    OUTPUT/metrics/wandb/                                   with trainer.wandb.enabled (offline by default)

Behaviour a launcher can rely on:

* exits 0 after ``trainer.total_steps`` steps; re-running a finished run exits 0 at once;
* resumes from the newest checkpoint that passes verification by itself (after a crash or SIGKILL;
  newer ones that fail it are skipped with a warning naming them and why, and set aside);
* SIGTERM or SIGINT (a preemption notice): finishes the step in flight, checkpoints, exits 0;
* publishes version 0 (the initial weights) before its first step, then version N after step N;
* exports the last step as a complete Hugging Face folder (weights, config, tokenizer,
  generation_config.json), readable by ``rlax generate`` / ``rlax evaluate`` and transformers;
* fails loudly (exit 1) if no rollout groups arrive within ``trainer.wait_timeout_s`` (the first ones
  within that plus ``loop.startup_budget_s``: the rollout fleet starts up first).

Multi-host: start one process per host with ``trainer.mesh.coordinator_address``,
``trainer.mesh.num_processes`` and ``trainer.mesh.process_id`` set (or ``trainer.mesh.distributed=true``
on TPU / Cloud, where JAX finds them).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading

HELP = "the JAX trainer job: learn from rollout groups, publish weights"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="override run.output_dir")


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from rlax_core.config import ConfigError
    from rlax_core.utils import startup
    from pipelines.run_folder import writable

    startup.mark_process_start("trainer")

    if beam_args:
        raise ConfigError("", f"rlax train takes no Beam options; unknown arguments: {' '.join(beam_args)}")
    if args.output:  # before the config's imports; a trainer restarted into its own folder resumes there
        writable(args.output)
    from pipelines.config import load_run_config
    from pipelines.plan import check_memory

    overrides = list(args.overrides) + ([f"run.output_dir={args.output}"] if args.output else [])
    run_config = load_run_config(args.config, overrides)
    check_memory(run_config, roles=("trainer",))
    from rlax_core.utils.compile_cache import enable_compilation_cache

    enable_compilation_cache(run_config.run.compilation_cache_dir, enabled=run_config.run.compilation_cache)
    stop = threading.Event()

    def request_stop(signum, _frame):
        log.warning("received %s: checkpointing after the current step", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    result = train(run_config, stop)
    log.info("trainer done at step %d%s", result.step, " (stopped early)" if result.preempted else "")
    output = run_config.run.output_dir.rstrip("/")
    model = f"model {output}/hf/step_{result.step:08d}; " if not result.preempted else ""
    print(f"rlax train: step {result.step}{' (stopped early)' if result.preempted else ''}; {model}"
          f"checkpoints {output}/checkpoints; weights {run_config.weight_store().root}; metrics {output}/metrics")
    return 0


def train(run_config, stop: threading.Event | None = None):
    import jax.numpy as jnp

    from rlax_core.data.rollout_store import RolloutStore
    from rlax_core.models import from_pretrained
    from rlax_core.training.job import run_training
    from rlax_core.utils import startup
    from rlax_core.weights import WeightStore
    from pipelines.initial_policy import prepare_policy

    startup.mark("trainer_imports")
    output = run_config.run.output_dir.rstrip("/")
    model = from_pretrained(prepare_policy(run_config), dtype=jnp.float32)
    startup.mark("trainer_model")
    weights = WeightStore(run_config.weight_store())
    try:
        trainer = run_config.trainer
        if trainer.wandb.enabled and not trainer.wandb.name:
            trainer = dataclasses.replace(trainer, wandb=dataclasses.replace(trainer.wandb, name=run_config.run.name))
        return run_training(
            model_config=model.config, initial_params=model.params, algorithm=run_config.algorithm,
            config=trainer, store=RolloutStore(run_config.rollout_root(), run_config.run.name),
            weights=weights, checkpoint_dir=f"{output}/checkpoints", metrics_dir=run_config.metrics_dir(), stop=stop,
            export=hf_export(run_config, model.config),
            rollouts_per_step=run_config.rows_per_step(),
            # The first rollout groups come after the fleet's start-up: the first wait covers it.
            startup_wait_s=run_config.loop.startup_budget_s)
    finally:
        weights.close()


def hf_export(run_config, model_config):
    """What the job's Hugging Face folders and model templates hold: the run's tokenizer and sampling settings."""
    from rlax_core.models.export import tokenizer_source_of
    from rlax_core.training.job import HFExport
    from rlax_core.policy.source import MODEL_TEMPLATE

    output = run_config.run.output_dir.rstrip("/")
    sampling = run_config.loop.sampling
    stops = [*model_config.eos_token_ids, *(t for t in sampling.stop_token_ids if t not in model_config.eos_token_ids)]
    generation = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                  "max_new_tokens": sampling.budget(run_config.engine), "eos_token_id": stops or None}
    tokenizer = run_config.model.tokenizer or tokenizer_source_of(run_config.policy_path())
    return HFExport(root=f"{output}/hf", tokenizer_source=tokenizer, generation=generation,
                    template_dirs=(f"{run_config.weight_store().root.rstrip('/')}/{MODEL_TEMPLATE}",
                                   f"{output}/checkpoints/{MODEL_TEMPLATE}"))
