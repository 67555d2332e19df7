"""The ``dpo`` training objective: DPO's sigmoid loss (with label smoothing), IPO, and an SFT term.

Per pair, with ``pi`` the policy's and ``ref`` the reference's log-probability of a completion
(summed over its tokens; IPO: their mean, as in TRL) and ``z = (pi_c - pi_r) - (ref_c - ref_r)``::

    sigmoid   l = -(1 - ls) log sigmoid(beta z) - ls log sigmoid(-beta z)       (DPO; cDPO with ls > 0)
    ipo       l = (z - 1 / (2 beta)) ** 2
    rewards   beta (pi_c - ref_c), beta (pi_r - ref_r) of the summed log-probs (IPO too, as TRL logs
              them); margin their difference; accuracy c > r

The loss is the mean over pairs, plus ``sft_coef`` times the chosen completions' token-mean NLL.

**Pairs anywhere in a packed batch.** A pair's loss is not a sum over its tokens: it needs both
samples' totals, and packing puts chosen and rejected rows wherever they fit, in different
micro-batches or on different devices. So the batch's loss is taken as a function of each sample's
total log-prob ``S_i`` (``batch_loss``): the trainer's ``prepare`` scores the batch once without a
gradient, and ``c_i = dL/dS_i`` there is each sample's coefficient. The updates then differentiate
``sum_i c_i S_i``, a sum over tokens like any other loss, which micro-batches, packed rows and
devices split and add up exactly: its gradient is ``sum_i c_i grad S_i``, the gradient of ``L``. It
costs one forward more per step than TRL's concatenated forward; in exchange chosen and rejected
rows are packed like any others. One update per batch (``check``): the coefficients are those of the
weights the batch is scored with. With LoRA dropout the updates' forward drops what the scoring
forward did not: the gradient is then DPO's at the undropped policy, taken through the dropped one.

Samples pair by ``group_ids`` (one id per pair), ``rewards`` 1 for the chosen and 0 for the rejected
(``sft_data.preference_batch``). The reference's totals come from the trainer's reference forward
(``dpo.reference=step``; with LoRA the base) or with the batch (``reference_logprobs`` [S]).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlax_core.config import InputError
from rlax_core.training.objective import OBJECTIVES, Arrays, TrainingObjective

# What makes two models one architecture for DPO: the same tokens in, the same shapes throughout.
ARCHITECTURE_FIELDS = ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                       "num_kv_heads", "head_dim")


def pair_losses(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, loss: str = "sigmoid",
                beta: float = 0.1, label_smoothing: float = 0.0):
    """Per pair: the loss, the chosen and the rejected rewards (see the module docstring)."""
    z = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if loss == "sigmoid":
        losses = -(1 - label_smoothing) * jax.nn.log_sigmoid(beta * z) - label_smoothing * jax.nn.log_sigmoid(-beta * z)
    elif loss == "ipo":
        losses = jnp.square(z - 1 / (2 * beta))
    else:
        raise ValueError(f"dpo.loss={loss!r}: expected sigmoid or ipo")
    return losses, beta * (policy_chosen - ref_chosen), beta * (policy_rejected - ref_rejected)


def pairs_of(group_ids, chosen, sample_mask):
    """``(per_pair, complete)`` for a batch's [S] samples paired by ``group_ids``, ``chosen`` 1 or 0:
    ``per_pair(values [S])`` gives each pair's (chosen value, rejected value), [S] each (slot p: pair
    id p), and ``complete`` [S] marks the pairs that have one of each (padding slots have none)."""
    slots = group_ids.shape[0]
    real = sample_mask > 0
    ids = jnp.where(real, group_ids, slots)  # padding slots go to a segment no pair has
    is_chosen, is_rejected = real & (chosen > 0), real & (chosen <= 0)

    def side(values, which):
        return jax.ops.segment_sum(jnp.where(which, values, 0.0), ids, num_segments=slots + 1)[:slots]

    ones = jnp.ones(group_ids.shape, jnp.float32)
    complete = (side(ones, is_chosen) == 1) & (side(ones, is_rejected) == 1)
    return (lambda values: (side(values, is_chosen), side(values, is_rejected))), complete


def batch_loss(policy_totals, ref_totals, lengths, group_ids, chosen, sample_mask, *, loss: str = "sigmoid",
               beta: float = 0.1, label_smoothing: float = 0.0, sft_coef: float = 0.0):
    """The batch's loss and metrics from each sample's total log-probs [S] (policy and reference),
    trained tokens ``lengths`` [S], pair ``group_ids`` [S], ``chosen`` [S] (1 or 0), ``sample_mask`` [S]."""
    is_chosen = (sample_mask > 0) & (chosen > 0)
    per_pair, complete = pairs_of(group_ids, chosen, sample_mask)
    scale = 1.0 / jnp.maximum(lengths, 1.0) if loss == "ipo" else 1.0  # IPO compares mean log-probs, as TRL does
    (pc, pr), (rc, rr) = per_pair(policy_totals * scale), per_pair(ref_totals * scale)
    losses, _, _ = pair_losses(pc, pr, rc, rr, loss=loss, beta=beta, label_smoothing=label_smoothing)
    # The rewards are the implicit reward of the whole completion, whichever the loss (IPO's are not
    # per token): as TRL's DPOTrainer logs them (tests/training/test_dpo_trl.py)
    (pc, pr), (rc, rr) = per_pair(policy_totals), per_pair(ref_totals)
    chosen_rewards, rejected_rewards = beta * (pc - rc), beta * (pr - rr)
    pairs = jnp.maximum(jnp.sum(complete), 1)
    mean = lambda x: jnp.sum(jnp.where(complete, x, 0.0)) / pairs  # noqa: E731
    total = mean(losses)
    metrics = {"dpo_loss": total, "rewards_chosen": mean(chosen_rewards), "rewards_rejected": mean(rejected_rewards),
               "rewards_margin": mean(chosen_rewards - rejected_rewards),
               "rewards_accuracy": mean((chosen_rewards > rejected_rewards).astype(jnp.float32)),
               "num_pairs": jnp.sum(complete)}
    if sft_coef > 0:
        chosen_tokens = jnp.sum(jnp.where(is_chosen, lengths, 0.0))
        nll = -jnp.sum(jnp.where(is_chosen, policy_totals, 0.0)) / jnp.maximum(chosen_tokens, 1.0)
        metrics["chosen_nll"] = nll
        total = total + sft_coef * nll
    return total, metrics


def check_reference(policy_config: Any, reference_config: Any, where: str) -> None:
    """Refuse, in one line, a reference model of another architecture than the policy's."""
    differ = [f"{name} {getattr(reference_config, name)}, not {getattr(policy_config, name)}"
              for name in ARCHITECTURE_FIELDS if getattr(reference_config, name) != getattr(policy_config, name)]
    if differ:
        raise InputError(f"reference {where} is not the policy's architecture: {'; '.join(differ)}")


class SampleTotalsObjective(TrainingObjective):
    """An objective whose loss is a function of each sample's total (see the module docstring): the
    trainer scores the batch once, ``batch_loss_of(batch, totals, scored)`` gives the loss and its
    metrics, and the updates differentiate ``sum_i c_i S_i`` with ``c_i = dL/dS_i``. DPO's totals are
    log-probs; a reward model's (``bradley_terry``) are its scores."""

    def scores_policy(self, updates_per_batch: int) -> bool:
        return True  # the coefficients are the loss's derivatives at the policy's totals

    def check(self, trainer_config) -> None:
        if trainer_config.ppo_epochs != 1 or trainer_config.mini_batches != 1:
            raise ValueError(f"{self.name}: one optimizer update per batch (its samples' coefficients are taken once "
                             "per batch); set trainer.ppo_epochs=1 and trainer.mini_batches=1 (micro-batches may "
                             "split it)")

    def batch_loss_of(self, batch: Arrays, totals: jax.Array, scored: Arrays):
        raise NotImplementedError

    def prepare(self, batch: Arrays, scored: Arrays) -> dict[str, jax.Array]:
        totals = jnp.sum(scored["old_logprobs"] * batch["loss_mask"], axis=-1)
        (total, metrics), coefficients = jax.value_and_grad(
            lambda t: self.batch_loss_of(batch, t, scored), has_aux=True)(totals)
        return {"sample_coefficients": coefficients, "preference_loss": total,
                **{f"preference/{name}": value for name, value in metrics.items()}}

    def update_inputs(self, batch: Arrays, prepared: Arrays) -> dict[str, jax.Array]:
        return {"loss_mask": batch["loss_mask"], "sample_coefficients": prepared["sample_coefficients"]}

    def token_weights(self, mask):
        # Every micro-batch's surrogate is already its part of the batch's loss: a share of 1.
        return jnp.asarray(mask, jnp.float32)

    def loss(self, logprobs, entropy, micro, *, one_update):
        totals = jnp.sum(jnp.where(micro["loss_mask"] > 0, logprobs, 0.0), axis=-1)
        return jnp.sum(jax.lax.stop_gradient(micro["sample_coefficients"]) * totals), {}

    def batch_metrics(self, batch: Arrays, prepared: Arrays) -> dict[str, jax.Array]:
        metrics = {name.split("/", 1)[1]: value for name, value in prepared.items() if name.startswith("preference/")}
        return {**metrics, "loss": prepared["preference_loss"]}


@OBJECTIVES.register("dpo")
class PreferenceObjective(SampleTotalsObjective):
    name = "dpo"

    def __init__(self, config: Any):
        self.config = config  # a DpoConfig
        self.uses_reference = config.reference == "step"

    def batch_loss_of(self, batch: Arrays, totals: jax.Array, scored: Arrays):
        mask, config = batch["loss_mask"], self.config
        if "reference_logprobs" in batch:
            ref_totals = batch["reference_logprobs"]
        else:
            ref_totals = jnp.sum(scored["ref_logprobs"] * mask, axis=-1)
        return batch_loss(totals, ref_totals, jnp.sum(mask, axis=-1), batch["group_ids"], batch["rewards"],
                          batch["sample_mask"], loss=config.loss, beta=config.beta,
                          label_smoothing=config.label_smoothing, sft_coef=config.sft_coef)
