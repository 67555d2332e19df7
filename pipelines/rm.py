"""``rlax rm``: a Bradley-Terry reward model on chosen/rejected pairs (the trainer with the rm objective).

    rlax rm --config configs/quickstart.yaml rm.data=runs/rft/stories260k/pairs-*.parquet trainer.total_steps=40

Reads ``model.path`` (the starting point: a policy, whose classifier is replaced by a zero score head,
or a sequence-classification reward model to train further), ``trainer`` (one update per batch:
``ppo_epochs`` and ``mini_batches`` 1; LoRA trains the adapters and the score head) and ``rm`` (data:
``PreferencePair`` records, users' own or ``rlax rft``'s verified-against-failed pairs; margin,
center_coefficient, pairs_per_step, validation). Writes what ``rlax sft`` writes but weight versions:
checkpoints (exact resume), ``OUTPUT/hf/step_XXXXXXXX`` (a ``*ForSequenceClassification`` folder that
transformers and the ``reward_model`` term load) with ``reward_stats.json`` beside the weights (the
mean and std of the final model's scores of the training pairs: the term's ``normalize: saved``), and
per step ``train/loss``, ``train/pair_accuracy``, ``train/margin``, ``train/score_mean``,
``train/score_std``, and ``train/heldout_pair_accuracy`` / ``train/heldout_margin`` of the held-out
pairs. docs/reward_models.md.
"""

from __future__ import annotations

import argparse
import logging
import threading

from pipelines.sft import add_arguments, load_policy, report, split_pairs, start  # noqa: F401 (add_arguments: the CLI reads it)

HELP = "train a Bradley-Terry reward model on chosen/rejected pairs (the trainer with the rm objective)"

log = logging.getLogger(__name__)
STATS_PAIRS = 1024  # training pairs scored for the saved mean and std (the first by id)


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    run_config, stop = start(args, beam_args, "rm")
    result = reward_model(run_config, stop)
    code = report("rm", run_config, result)
    if not result.preempted:
        print(f"rlax rm: score statistics {run_config.run.output_dir.rstrip('/')}/hf/step_{result.step:08d}/"
              "reward_stats.json")
    return code


def reward_model(run_config, stop: threading.Event | None = None):
    """Train the reward model (see the module docstring); returns the job's ``JobResult``."""
    import numpy as np

    from rlax_core.config import InputError
    from rlax_core.training.bradley_terry import BradleyTerryObjective
    from rlax_core.training.post_job import run_post_training, step_indices
    from rlax_core.training.reward_model import init_reward_params, reward_model_config, reward_samples
    from rlax_core.training.sft_data import preference_batch
    from pipelines.train import hf_export

    config, trainer_config = run_config.rm, run_config.trainer
    train_records, validation_records = split_pairs(config, ("id", "prompt", "chosen", "rejected"))
    policy, tokenizer = load_policy(run_config)
    if policy.config.score_head:  # a reward model already: trained further
        model_config, params = policy.config, policy.params
    else:
        model_config, params = reward_model_config(policy.config), init_reward_params(policy.params)
    pad_id, T = model_config.pad_token_id or 0, trainer_config.max_seq_len
    with_margins = any(record.get("margin") is not None for record in train_records)

    def fitting(records):
        pairs = [(reward_samples(record, tokenizer, pad_id), float(record.get("margin") or 0.0)) for record in records]
        return [pair for pair in pairs if max(len(side.tokens) for side in pair[0]) <= T], pairs

    train, all_train = fitting(train_records)
    held_out, _ = fitting(validation_records)
    if not train:
        raise InputError(f"rm.data {config.data}: no pair fits trainer.max_seq_len={T} (prompt + completion + 1 tokens)")
    per_step = config.pairs_per_step

    def batch_of(pairs, trainer):
        batch = preference_batch([sides for sides, _ in pairs], max_seq_len=T, row_multiple=trainer.row_multiple,
                                 pad_id=pad_id)
        if with_margins:
            batch["margins"] = np.zeros(len(batch["sample_mask"]), np.float32)
            batch["margins"][0:2 * len(pairs):2] = [margin for _, margin in pairs]
        return batch

    def step_batch(step, trainer):
        return batch_of([train[i] for i in step_indices(len(train), per_step, step, config.shuffle_seed)], trainer)

    def validation(trainer):
        return [batch_of(held_out[i:i + per_step], trainer) for i in range(0, len(held_out), per_step)]

    def evaluate(trainer, state, batches):
        chosen, rejected = held_out_scores(trainer, state, batches)
        return {"train/heldout_pair_accuracy": float(np.mean(chosen > rejected)),
                "train/heldout_margin": float(np.mean(chosen - rejected))}

    output = run_config.run.output_dir.rstrip("/")
    export = hf_export(run_config, model_config)
    result = run_post_training(
        model_config=model_config, initial_params=params,
        objective=BradleyTerryObjective(config.margin, config.center_coefficient), config=trainer_config,
        step_batch=step_batch, validation=validation, eval_every=config.eval_every, weights=None,
        checkpoint_dir=f"{output}/checkpoints", metrics_dir=run_config.metrics_dir(),
        data_metrics={"data/pairs": len(train), "data/refused": len(all_train) - len(train),
                      "data/heldout_pairs": len(held_out)},
        stop=stop, export=export, evaluate=evaluate if held_out else None)
    if not result.preempted:
        save_score_stats(export.folder(result.step), [sides for sides, _ in train[:STATS_PAIRS]], T, pad_id)
    return result


def held_out_scores(trainer, state, batches):
    """The held-out pairs' (chosen scores, rejected scores) under ``state``: the trainer's packed
    forward, paired again by the packed batch's group ids (packing moves the samples)."""
    import jax
    import numpy as np

    from rlax_core.training.preference import pairs_of

    chosen, rejected = [], []
    for batch in batches:
        packed = trainer.pack(batch)
        scores = trainer.sequence_logprobs(packed, state=state)
        per_pair, complete = pairs_of(*(np.asarray(packed[name]) for name in ("group_ids", "rewards", "sample_mask")))
        (c, r), complete = jax.device_get((per_pair(scores), complete))
        chosen.append(np.asarray(c)[complete])
        rejected.append(np.asarray(r)[complete])
    return np.concatenate(chosen), np.concatenate(rejected)


def save_score_stats(folder: str, pairs, max_seq_len: int, pad_id: int) -> None:
    """``reward_stats.json`` in the exported folder: the mean and std of the exported model's scores of
    ``pairs`` (both sides), read back from the folder as the ``reward_model`` term reads it."""
    import jax
    import numpy as np

    from rlax_core.models import from_pretrained
    from rlax_core.training.reward_model import sequence_scores, write_score_stats

    model = from_pretrained(folder, dtype=np.float32)
    score = jax.jit(lambda params, tokens, mask: sequence_scores(params, model.config, tokens, mask))
    rows = [side.tokens[:-1] for pair in pairs for side in pair]  # the placeholder is the trainer's alone
    scores = []
    for start in range(0, len(rows), 64):
        chunk = rows[start:start + 64]
        tokens = np.full((64, max_seq_len), pad_id, np.int32)
        mask = np.zeros((64, max_seq_len), np.int32)
        mask[len(chunk):, 0] = 1
        for row, ids in enumerate(chunk):
            tokens[row, :len(ids)], mask[row, :len(ids)] = ids, 1
        scores.extend(np.asarray(score(model.params, tokens, mask))[:len(chunk)])
    write_score_stats(folder, {"score_mean": float(np.mean(scores)), "score_std": float(np.std(scores))})
    log.info("reward model scores of %d training sequences: mean %.4f, std %.4f", len(scores), np.mean(scores),
             np.std(scores))
