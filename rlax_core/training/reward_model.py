"""A Bradley-Terry reward model: the policy's decoder with a one-label ``score`` head on the last real token.

The same parameter tree as the policy's, with ``score: {"kernel": [hidden]}`` in place of
``lm_head``: the layout of Hugging Face's ``LlamaForSequenceClassification``,
``Qwen2ForSequenceClassification`` and ``Qwen3ForSequenceClassification`` (a ``score`` Linear
without bias, ``num_labels=1``), so ``models.checkpoint``'s one name/layout table loads theirs and
saves ours (``ModelConfig.score_head``). As the PPO critic (``value_model.py``) the head starts at
zero: every pair starts at margin 0, loss log 2, and the head's gradient is the backbone's features.

Scores are read where Hugging Face reads them: the last position the attention mask marks real
(transformers takes the rightmost token that is not ``pad_token_id``, the same position for a
right-padded batch whose text holds no pad token).

The loss of a pair (chosen c, rejected r), as TRL's ``RewardTrainer``::

    -log sigmoid(s_c - s_r - margin) + center_coefficient * (s_c + s_r)^2

the margin optional per pair (Llama 2's preference-strength margin), the centring term TRL's
``center_rewards_coefficient`` (it keeps scores near zero so that no offset drifts). The pure parts
live here; the trainer's objective seam runs them as a job of the same trainer.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.config import InputError
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import hidden_states, param_logical_axes

Params = dict[str, Any]
SCORE_STATS_FILE = "reward_stats.json"  # beside the weights: the training scores' mean and std


def reward_model_config(policy_config: ModelConfig) -> ModelConfig:
    """The policy's shape with a score head in place of its classifier."""
    return dataclasses.replace(policy_config, score_head=True)


def init_reward_params(policy_params: Params) -> Params:
    """A reward model from the policy's parameters: the same backbone (copied), a zero score head."""
    backbone = {name: jax.tree.map(jnp.copy, tree) for name, tree in policy_params.items() if name != "lm_head"}
    embedding = backbone["embed_tokens"]["embedding"]
    return {**backbone, "score": {"kernel": jnp.zeros(embedding.shape[-1:], embedding.dtype)}}


def reward_logical_axes(config: ModelConfig) -> Params:
    """Logical axis names of the reward model's tree, for the trainer's partition rules."""
    axes = {name: tree for name, tree in param_logical_axes(config).items() if name != "lm_head"}
    return {**axes, "score": {"kernel": ("embed",)}}


def last_token_index(attention_mask) -> jax.Array:
    """[B] the last position each row's mask marks real (right or left padding alike)."""
    mask = jnp.asarray(attention_mask)
    positions = jnp.arange(mask.shape[-1])
    return jnp.max(jnp.where(mask > 0, positions, -1), axis=-1)


def sequence_scores(params: Params, config: ModelConfig, tokens, attention_mask, *, remat: bool = False,
                    attention: str = "dense", mesh=None) -> jax.Array:
    """[B] float32: one score per sequence, the score head on the last real token's hidden state."""
    backbone = {name: tree for name, tree in params.items() if name != "score"}
    hidden = hidden_states(backbone, config, tokens, attention_mask=attention_mask, remat=remat,
                           attention=attention, mesh=mesh)
    last = hidden[jnp.arange(hidden.shape[0]), last_token_index(attention_mask)]
    # float32 as the policy's logits: the score is a regression output compared across pairs.
    return jnp.einsum("be,e->b", last.astype(jnp.float32), params["score"]["kernel"].astype(jnp.float32))


def position_scores(params: Params, config: ModelConfig, tokens, attention_mask=None, **options) -> jax.Array:
    """[B, T-1] float32: the score head on each position's hidden state (position t: the score of
    tokens <= t), aligned with the trainer's per-token arrays; the trainer reads a sequence's score
    at its last real token (``reward_sample`` marks it)."""
    backbone = {name: tree for name, tree in params.items() if name != "score"}
    hidden = hidden_states(backbone, config, tokens, attention_mask=attention_mask, **options)[:, :-1]
    return jnp.einsum("bte,e->bt", hidden.astype(jnp.float32), params["score"]["kernel"].astype(jnp.float32))


def bradley_terry_loss(chosen_scores, rejected_scores, margin=None, center_coefficient: float = 0.0,
                       weights=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The mean pair loss and the pair metrics (accuracy, margin, score mean and std) of [P] scores;
    ``weights`` [P] (1 or 0): which pairs count (a packed batch's padding slots do not)."""
    chosen = jnp.asarray(chosen_scores, jnp.float32)
    rejected = jnp.asarray(rejected_scores, jnp.float32)
    weights = jnp.ones_like(chosen) if weights is None else jnp.asarray(weights, jnp.float32)
    mean = lambda x: jnp.sum(weights * x) / jnp.maximum(jnp.sum(weights), 1.0)  # noqa: E731
    difference = chosen - rejected
    shifted = difference if margin is None else difference - jnp.asarray(margin, jnp.float32)
    loss = -mean(jax.nn.log_sigmoid(shifted))
    if center_coefficient:
        loss = loss + center_coefficient * mean((chosen + rejected) ** 2)
    score_mean = mean((chosen + rejected) / 2)
    variance = mean(((chosen - score_mean) ** 2 + (rejected - score_mean) ** 2) / 2)
    metrics = {"pair_accuracy": mean((difference > 0).astype(jnp.float32)), "margin": mean(difference),
               "score_mean": score_mean, "score_std": jnp.sqrt(variance)}
    return loss, metrics


def pair_loss(params: Params, config: ModelConfig, batch: Mapping[str, Any], center_coefficient: float = 0.0,
              **options) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of a :func:`pair_batch` (chosen rows first, then rejected, one forward for both)."""
    scores = sequence_scores(params, config, batch["tokens"], batch["attention_mask"], **options)
    pairs = scores.shape[0] // 2
    return bradley_terry_loss(scores[:pairs], scores[pairs:], batch.get("margin"), center_coefficient)


def reward_ids(pair: Mapping[str, Any], side: str, tokenizer) -> list[int]:
    """The ids the reward model reads for one side of a preference pair: prompt + completion as the
    ``reward_model`` term renders a sample (a chat prompt through the tokenizer's chat template with
    the completion as the assistant's turn, else the text with BOS). A pair with an empty side is refused."""
    for field in ("prompt", side):
        if not str(pair.get(field) or "").strip():
            raise InputError(f"preference pair {pair.get('id', '?')!r}: empty {field!r}; a pair needs a "
                             "prompt, a chosen and a rejected completion")
    prompt, completion = str(pair["prompt"]), str(pair[side])
    messages = _chat(prompt)
    if messages is not None and getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode(tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": completion}])))
    return list(tokenizer.encode(prompt + completion, add_bos=True))


def _chat(prompt: str) -> list | None:
    if not prompt.lstrip().startswith("["):
        return None
    try:
        messages = json.loads(prompt)
    except ValueError:
        return None
    return messages if isinstance(messages, list) and all(isinstance(m, dict) for m in messages) else None


def reward_samples(pair: Mapping[str, Any], tokenizer, pad_id: int = 0):
    """A pair as the trainer's two samples (``sft_data.Tokenized``: chosen, then rejected): each the
    reward model's ids and one placeholder token after them, whose position alone is marked, so the
    trainer's per-position output there (``position_scores``: the score of every token before it) is
    the sequence's score, read where Hugging Face reads it. The placeholder is never attended to."""
    from rlax_core.training.sft_data import Tokenized

    out = []
    for side in ("chosen", "rejected"):
        ids = reward_ids(pair, side, tokenizer)
        trained = np.zeros(len(ids) + 1, np.float32)
        trained[-1] = 1.0
        out.append(Tokenized(str(pair.get("id", "?")), np.asarray([*ids, pad_id], np.int32), trained))
    return tuple(out)


def pair_batch(pairs: Sequence[Mapping[str, Any]], tokenizer, max_length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Token rows of preference pairs (``PREFERENCE_PAIR_SCHEMA`` rows): [2P, max_length], the chosen
    sides first, each prompt + completion (``reward_ids``) right-padded."""
    rows = [reward_ids(pair, side, tokenizer)[:max_length] for side in ("chosen", "rejected") for pair in pairs]
    tokens = np.full((len(rows), max_length), pad_id, np.int32)
    mask = np.zeros((len(rows), max_length), np.int32)
    for row, ids in enumerate(rows):
        tokens[row, :len(ids)], mask[row, :len(ids)] = ids, 1
    batch = {"tokens": tokens, "attention_mask": mask}
    if any(pair.get("margin") is not None for pair in pairs):
        batch["margin"] = np.asarray([float(pair.get("margin") or 0.0) for pair in pairs], np.float32)
    return batch


def write_score_stats(folder, metrics: Mapping[str, float]) -> None:
    """Save the training scores' mean and std beside the model: the reward term normalises with them."""
    from rlax_core.utils.storage import open_storage

    stats = {"mean": float(metrics["score_mean"]), "std": float(metrics["score_std"])}
    open_storage(str(folder)).write(SCORE_STATS_FILE, (json.dumps(stats) + "\n").encode())


def read_score_stats(folder) -> dict[str, float] | None:
    """The saved score statistics of a reward model folder, or None when it has none."""
    from rlax_core.utils.storage import open_storage

    storage = open_storage(str(folder))
    if not storage.exists(SCORE_STATS_FILE):
        return None
    return {key: float(value) for key, value in json.loads(storage.read(SCORE_STATS_FILE)).items()}
