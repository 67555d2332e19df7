"""``rlax dpo``: direct preference optimization on ``PreferencePair`` records (the trainer with the dpo objective).

    rlax dpo --config configs/quickstart.yaml dpo.data=pairs.parquet dpo.beta=0.1 trainer.total_steps=20

Reads ``model.path`` (the policy, and the reference unless ``dpo.reference_model`` names another of
the same architecture; with LoRA the base is the reference), ``trainer`` (one update per batch:
``ppo_epochs`` and ``mini_batches`` 1) and ``dpo`` (data, loss, beta, label_smoothing, sft_coef,
reference: step | precomputed, pairs_per_step). Writes what ``rlax sft`` writes; per step
``train/loss``, ``train/rewards_chosen``, ``train/rewards_rejected``, ``train/rewards_margin``,
``train/rewards_accuracy``, and ``train/heldout_nll`` of the held-out pairs' chosen completions.
docs/post_training.md.
"""

from __future__ import annotations

import argparse
import logging
import threading

from pipelines.sft import add_arguments, load_policy, report, split_pairs, start  # noqa: F401 (add_arguments: the CLI reads it)

HELP = "direct preference optimization (DPO, IPO) on chosen/rejected pairs, the base or a frozen model as reference"

log = logging.getLogger(__name__)


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    run_config, stop = start(args, beam_args, "dpo")
    return report("dpo", run_config, dpo(run_config, stop))


def dpo(run_config, stop: threading.Event | None = None):
    import numpy as np

    from rlax_core.config import InputError
    from rlax_core.models import from_pretrained
    from rlax_core.training.post_job import run_post_training, step_indices
    from rlax_core.training.preference import PreferenceObjective, check_reference
    from rlax_core.training.sft_data import preference_batch, supervised_batch, tokenize_pair
    from rlax_core.weights import WeightStore
    from pipelines.train import hf_export

    config, trainer_config = run_config.dpo, run_config.trainer
    train_records, validation_records = split_pairs(config)
    model, tokenizer = load_policy(run_config)
    ref_params = None
    if config.reference_model:
        reference = from_pretrained(config.reference_model, dtype=np.float32)
        check_reference(model.config, reference.config, config.reference_model)
        ref_params = reference.params
    elif not trainer_config.lora.enabled:
        ref_params = model.params  # the initial policy, frozen
    T = trainer_config.max_seq_len
    pairs = [tokenize_pair(r, tokenizer) for r in train_records]
    fits = [p for p in pairs if max(len(p[0].tokens), len(p[1].tokens)) <= T]
    validation_pairs = [tokenize_pair(r, tokenizer) for r in validation_records]
    validation_chosen = [p[0] for p in validation_pairs if len(p[0].tokens) <= T]
    if not fits:
        raise InputError(f"dpo.data {config.data}: no pair fits trainer.max_seq_len={T}")
    pad_id, per_step = model.config.pad_token_id or 0, config.pairs_per_step
    reference_totals: list = []  # per pair (chosen, rejected): dpo.reference=precomputed, computed once

    def precompute(trainer):
        for i in range(0, len(fits), per_step):
            batch = preference_batch(fits[i:i + per_step], max_seq_len=T, row_multiple=trainer.row_multiple,
                                     pad_id=pad_id)
            totals = np.asarray(trainer.sequence_logprobs(trainer.pack(batch), ref_params=ref_params))
            reference_totals.extend(totals[:2 * len(fits[i:i + per_step])].reshape(-1, 2))

    def step_batch(step, trainer):
        if config.reference == "precomputed" and not reference_totals:
            precompute(trainer)
        chosen = step_indices(len(fits), per_step, step, config.shuffle_seed)
        totals = [reference_totals[i] for i in chosen] if config.reference == "precomputed" else None
        return preference_batch([fits[i] for i in chosen], max_seq_len=T, row_multiple=trainer.row_multiple,
                                pad_id=pad_id, reference_logprobs=totals)

    def validation(trainer):
        return [supervised_batch(validation_chosen[i:i + per_step], max_seq_len=T, row_multiple=trainer.row_multiple,
                                 pad_id=pad_id) for i in range(0, len(validation_chosen), per_step)]

    output = run_config.run.output_dir.rstrip("/")
    weights = WeightStore(run_config.weight_store())
    try:
        return run_post_training(
            model_config=model.config, initial_params=model.params, objective=PreferenceObjective(config),
            config=trainer_config, step_batch=step_batch, validation=validation, eval_every=config.eval_every,
            weights=weights, checkpoint_dir=f"{output}/checkpoints", metrics_dir=run_config.metrics_dir(),
            data_metrics={"data/pairs": len(fits), "data/refused": len(pairs) - len(fits)},
            ref_params=ref_params if config.reference == "step" else None, stop=stop,
            export=hf_export(run_config, model.config))
    finally:
        weights.close()
