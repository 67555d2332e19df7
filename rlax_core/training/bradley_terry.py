"""The ``rm`` training objective: a Bradley-Terry reward model on chosen/rejected pairs.

The trained model is the policy's decoder with a one-label score head (``ModelConfig.score_head``;
``heads.token_outputs`` gives each position's score where a language model gives log-probs). A
sample is a pair side's ids and one placeholder token, the placeholder's position alone marked
(``reward_model.reward_samples``), so a sample's total over its ``loss_mask`` is its score, read on
its last real token as Hugging Face reads it. Per pair (chosen c, rejected r)::

    loss = -log sigmoid(s_c - s_r - margin) + center_coefficient * (s_c + s_r)^2

(``reward_model.bradley_terry_loss``: TRL's ``RewardTrainer`` loss, the margin per pair from the data
plus ``rm.margin``, the centring term TRL's ``center_rewards_coefficient``), averaged over the pairs.
A pair's loss needs both its scores, and packing puts its sides anywhere: as DPO
(``preference.SampleTotalsObjective``) the batch is scored once, each sample's coefficient is the
loss's derivative at its score, and the updates differentiate ``sum_i c_i s_i``; one update per batch.

Metrics: ``loss``, ``pair_accuracy`` (s_c > s_r), ``margin`` (mean s_c - s_r), ``score_mean`` and
``score_std`` over both sides, ``num_pairs``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_core.training.objective import OBJECTIVES, Arrays
from rlax_core.training.preference import SampleTotalsObjective, pairs_of
from rlax_core.training.reward_model import bradley_terry_loss


def pair_score_loss(scores, group_ids, chosen, sample_mask, margins=None, *, margin: float = 0.0,
                    center_coefficient: float = 0.0):
    """The batch's loss and metrics from each sample's score [S], paired by ``group_ids``, ``chosen``
    1 or 0; ``margins`` [S]: each pair's own margin on its chosen sample (added to ``margin``)."""
    per_pair, complete = pairs_of(group_ids, chosen, sample_mask)
    chosen_scores, rejected_scores = per_pair(scores)
    pair_margin = margin + (per_pair(margins)[0] if margins is not None else 0.0)
    loss, metrics = bradley_terry_loss(chosen_scores, rejected_scores, pair_margin if margins is not None or margin
                                       else None, center_coefficient, weights=complete)
    return loss, {**metrics, "num_pairs": jnp.sum(complete)}


@OBJECTIVES.register("rm")
class BradleyTerryObjective(SampleTotalsObjective):
    name = "rm"

    def __init__(self, margin: float = 0.0, center_coefficient: float = 0.0):
        self.margin, self.center_coefficient = margin, center_coefficient

    def check(self, trainer_config) -> None:
        super().check(trainer_config)
        if trainer_config.lora.enabled and trainer_config.lora.dropout:
            raise ValueError("rm: trainer.lora.dropout must be 0 (the reward model's forward drops none of its adapters' "
                             "inputs)")

    def batch_loss_of(self, batch: Arrays, totals: jax.Array, scored: Arrays):
        return pair_score_loss(totals, batch["group_ids"], batch["rewards"], batch["sample_mask"],
                               batch.get("margins"), margin=self.margin, center_coefficient=self.center_coefficient)
