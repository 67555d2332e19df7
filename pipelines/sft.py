"""``rlax sft``: supervised fine-tuning on ``SftExample`` records, on the RL trainer's machinery.

    rlax sft --config configs/quickstart.yaml sft.data=runs/rft/sft.parquet trainer.total_steps=20

Reads (the run config, ``pipelines.config.RunConfig``):

    model.path                the initial policy (HF folder or llama2.c .bin), and its tokenizer
    trainer                   the RL trainer's section: optimizer, mesh, max_seq_len, row_tokens,
                              micro_batch_tokens, lora, total_steps, checkpoint_every, export_every
    sft                       data, validation_data / validation_fraction, loss_on, loss_aggregation,
                              over_length, window_overlap, examples_per_step, eval_every, shuffle_seed

Writes what ``rlax train`` writes (weight versions, checkpoints, OUTPUT/hf/step_XXXXXXXX, metrics):
per step ``train/loss``, ``train/tokens_per_s``, ``train/heldout_nll`` (every ``sft.eval_every``
steps, and at step 0) and the over-length counts ``data/...``. A record without a completion or a
chat without an assistant turn stops the job with one line naming it. docs/post_training.md.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import signal
import threading

HELP = "supervised fine-tuning on prompt + completion or chat records (the trainer with the sft objective)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="override run.output_dir")


def start(args: argparse.Namespace, beam_args: list[str], name: str):
    """The run config of a post-training job, with SIGTERM/SIGINT set to stop it after a step."""
    from rlax_core.config import ConfigError
    from pipelines.config import load_run_config

    if beam_args:
        raise ConfigError("", f"rlax {name} takes no Beam options; unknown arguments: {' '.join(beam_args)}")
    overrides = list(args.overrides) + ([f"run.output_dir={args.output}"] if args.output else [])
    run_config = load_run_config(args.config, overrides)
    from pipelines.plan import check_memory

    check_memory(run_config, roles=(name,))  # the trainer's memory for this job's batch (rlax plan --post-training)
    from rlax_core.utils.compile_cache import enable_compilation_cache

    enable_compilation_cache(run_config.run.compilation_cache_dir, enabled=run_config.run.compilation_cache)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return run_config, stop


def report(name: str, run_config, result) -> int:
    output = run_config.run.output_dir.rstrip("/")
    stopped = " (stopped early)" if result.preempted else ""
    model = f"model {output}/hf/step_{result.step:08d}; " if not result.preempted else ""
    print(f"rlax {name}: step {result.step}{stopped}; {model}checkpoints {output}/checkpoints; "
          f"metrics {run_config.metrics_dir()}")
    return 0


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    run_config, stop = start(args, beam_args, "sft")
    return report("sft", run_config, sft(run_config, stop))


def held_out(record_id: str, fraction: float) -> bool:
    """Whether a record is in the validation split: a stable function of its id (or other key) alone."""
    return int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) / 16 ** 8 < fraction


def split_records(path: str, validation_path: str, fraction: float, kind: str, required: tuple[str, ...],
                  key=lambda record: str(record["id"])):
    """(training records, held-out records): ``validation_path``'s, or else the records whose ``key``
    (default: the id; ``rlax rm``: the prompt, so no prompt has pairs on both sides) is ``held_out``."""
    from rlax_core.config import InputError
    from rlax_core.data.training_set import read_examples

    if not path:
        raise InputError(f"no training data: set {kind.lower()}.data to a parquet or JSONL file of {kind} records")
    records = read_examples(path, required=required, kind=kind)
    if validation_path:
        return records, read_examples(validation_path, required=required, kind=kind)
    return ([r for r in records if not held_out(key(r), fraction)], [r for r in records if held_out(key(r), fraction)])


def split_pairs(config, required: tuple[str, ...] = ("id", "chosen", "rejected")):
    """(training pairs, held-out pairs) of a ``dpo`` or ``rm`` config: ``validation_data``'s, or else
    split by prompt (a stable hash of its normalised text; a pair without one, by its id), so every
    pair of one prompt lands on the same side and held-out accuracy is of prompts never trained on
    (``rlax rft`` writes several pairs per prompt)."""
    from rlax_core.data.records import normalize_text

    return split_records(config.data, config.validation_data, config.validation_fraction, "PreferencePair",
                         required, key=lambda pair: normalize_text(str(pair.get("prompt") or pair["id"])))


def load_policy(run_config):
    import jax.numpy as jnp

    from rlax_core.models import from_pretrained
    from rlax_core.models.export import tokenizer_source_of
    from rlax_core.models.tokenizer import load_tokenizer
    from pipelines.initial_policy import prepare_policy

    model = from_pretrained(prepare_policy(run_config), dtype=jnp.float32)
    tokenizer = load_tokenizer(run_config.model.tokenizer or tokenizer_source_of(run_config.policy_path()))
    return model, tokenizer


def sft(run_config, stop: threading.Event | None = None):
    from rlax_core.config import InputError
    from rlax_core.training.post_job import run_post_training, step_indices
    from rlax_core.training.sft_data import LengthCounts, fit_length, supervised_batch, tokenize_example
    from rlax_core.training.supervised import SupervisedObjective
    from rlax_core.weights import WeightStore
    from pipelines.train import hf_export

    config, trainer_config = run_config.sft, run_config.trainer
    train_records, validation_records = split_records(config.data, config.validation_data, config.validation_fraction,
                                                      "SftExample", ("id",))
    model, tokenizer = load_policy(run_config)
    T = trainer_config.max_seq_len
    counts, validation_counts = LengthCounts(), LengthCounts()
    samples = fit_length([tokenize_example(r, tokenizer, config.loss_on) for r in train_records], T,
                         config.over_length, config.window_overlap, counts)
    validation_samples = fit_length([tokenize_example(r, tokenizer, config.loss_on) for r in validation_records], T,
                                    config.over_length, config.window_overlap, validation_counts)
    if not samples:
        raise InputError(f"sft.data {config.data}: no example fits trainer.max_seq_len={T} "
                         f"({counts.refused} refused); raise it, or set sft.over_length=truncate or window")
    log.info("sft: %d training samples, %d held out; over length: %s", len(samples), len(validation_samples), counts)
    pad_id = model.config.pad_token_id or 0
    per_step = config.examples_per_step

    def step_batch(step, trainer):
        chosen = [samples[i] for i in step_indices(len(samples), per_step, step, config.shuffle_seed)]
        return supervised_batch(chosen, max_seq_len=T, row_multiple=trainer.row_multiple, pad_id=pad_id)

    def validation(trainer):
        return [supervised_batch(validation_samples[i:i + per_step], max_seq_len=T, row_multiple=trainer.row_multiple,
                                 pad_id=pad_id) for i in range(0, len(validation_samples), per_step)]

    output = run_config.run.output_dir.rstrip("/")
    weights = WeightStore(run_config.weight_store())
    try:
        return run_post_training(
            model_config=model.config, initial_params=model.params,
            objective=SupervisedObjective(config.loss_aggregation), config=trainer_config, step_batch=step_batch,
            validation=validation, eval_every=config.eval_every, weights=weights,
            checkpoint_dir=f"{output}/checkpoints", metrics_dir=run_config.metrics_dir(),
            data_metrics={**counts.as_metrics("data"), **validation_counts.as_metrics("data/heldout")},
            stop=stop, export=hf_export(run_config, model.config))
    finally:
        weights.close()
