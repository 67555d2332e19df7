"""The ``rl`` training objective: ``rlax_core.rl``'s policy objective, for one ``AlgorithmConfig``.

Once per batch, before its first update, with the weights the batch arrived to, the trainer scores
(``scored``)::

    ref_logprobs   the frozen reference policy's log-probs, when the algorithm has a KL term
    old_logprobs   pi_old's, when the batch takes more than one update or the KL is in the reward
    old_values     the value model's, when the estimator needs values (PPO's GAE)

and ``prepare`` adds::

    kl             kl_estimate(old_logprobs, ref_logprobs): its kl_coef multiple is taken off the
                   token rewards when ``kl_in_reward`` (summed over the sequence for group estimators)
    advantages     rlax_core.rl.compute_advantages over the whole batch, plus each token's own
                   ``token_rewards`` where the rows carry them (on-policy distillation), undiscounted
    policy_mask    rlax_core.rl.trained_mask: the loss mask of the completions learnt from (GFPO's
                   retained ones); the updates' losses and token weights use it
    returns        rlax_core.rl.value_targets: the value model's regression targets

Per micro-batch::

    old_logprobs      = stop_gradient(logprobs) with one update per batch (the ratio is exactly 1.0),
                        else the prepared ones, held fixed across epochs and slices
    loss, metrics     = rlax_core.rl.policy_loss(...)
    value loss        = rlax_core.rl.value_loss(values, old_values, returns), the critic's own gradient
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_core.rl.advantages import compute_advantages, trained_mask, value_targets
from rlax_core.rl.aggregation import masked_mean, token_weights
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.kl import kl_estimate
from rlax_core.rl.objective import policy_loss, value_loss
from rlax_core.training.objective import OBJECTIVES, Arrays, TrainingObjective


@OBJECTIVES.register("rl")
class PolicyGradientObjective(TrainingObjective):
    name = "rl"

    def __init__(self, algorithm: AlgorithmConfig):
        self.algorithm = algorithm
        self.uses_values = algorithm.uses_values
        self.uses_reference = algorithm.uses_reference
        self.router_replay = algorithm.router_replay
        self.kl_in_reward = algorithm.kl_in_reward and algorithm.kl_coef > 0

    def scores_policy(self, updates_per_batch: int) -> bool:
        # pi_old must be computed apart from the training forward when a later update needs it (the
        # weights have moved by then) or when the rewards need it before any update (the KL penalty).
        return updates_per_batch > 1 or self.kl_in_reward

    def prepare(self, batch: Arrays, scored: Arrays) -> dict[str, jax.Array]:
        algorithm, mask = self.algorithm, batch["loss_mask"]
        prepared = {}
        kl = None
        if self.kl_in_reward:
            kl = prepared["kl"] = kl_estimate(scored["old_logprobs"], scored["ref_logprobs"],
                                              algorithm.kl_estimator) * mask
        values = scored.get("old_values")
        prepared["advantages"] = compute_advantages(algorithm, batch["rewards"], mask, group_ids=batch["group_ids"],
                                                    sample_mask=batch["sample_mask"], values=values, kl=kl)
        # The policy loss counts only the completions it learns from (GFPO's retained ones).
        prepared["policy_mask"] = trained_mask(algorithm, batch["rewards"], mask, group_ids=batch["group_ids"],
                                               sample_mask=batch["sample_mask"])
        if "token_rewards" in batch:  # a token's own reward (a teacher's verdict on it) is its own credit: undiscounted
            prepared["advantages"] = prepared["advantages"] + batch["token_rewards"] * prepared["policy_mask"]
        if self.uses_values:
            prepared["returns"] = value_targets(algorithm, batch["rewards"], mask, values, kl=kl)
        return prepared

    def update_inputs(self, batch: Arrays, prepared: Arrays) -> dict[str, jax.Array]:
        inputs = dict(loss_mask=prepared["policy_mask"], behavior_logprobs=batch["behavior_logprobs"],
                      advantages=prepared["advantages"])
        for name in ("old_logprobs", "ref_logprobs", "old_values", "returns"):
            if name in prepared:
                inputs[name] = prepared[name]
        return inputs

    def token_weights(self, mask: jax.Array) -> jax.Array:
        return token_weights(mask, self.algorithm.loss_aggregation, self.algorithm.loss_max_length)

    def loss(self, logprobs, entropy, micro, *, one_update):
        algorithm = self.algorithm
        old_logprobs = jax.lax.stop_gradient(logprobs) if one_update else micro["old_logprobs"]
        if algorithm.entropy_coef == 0:
            entropy = jax.lax.stop_gradient(entropy)
        return policy_loss(algorithm, logprobs, old_logprobs, micro["advantages"], micro["loss_mask"],
                           ref_logprobs=micro.get("ref_logprobs"), behavior_logprobs=micro["behavior_logprobs"],
                           entropy=entropy)

    def value_loss(self, values, micro, *, one_update):
        # One update per batch: the old critic is the critic, exactly (as for the policy's ratio).
        old_values = jax.lax.stop_gradient(values) if one_update else micro["old_values"]
        return value_loss(self.algorithm, values, old_values, micro["returns"], micro["loss_mask"])

    def batch_metrics(self, batch: Arrays, prepared: Arrays) -> dict[str, jax.Array]:
        mask, sample_mask = batch["loss_mask"], batch["sample_mask"]
        metrics = {"reward_mean": jnp.sum(batch["rewards"] * sample_mask) / jnp.maximum(jnp.sum(sample_mask), 1.0)}
        if "kl" in prepared:
            metrics["reward_kl"] = masked_mean(prepared["kl"], mask)  # the KL taken off the rewards, per token
        if "returns" in prepared:
            metrics["return_mean"] = masked_mean(prepared["returns"], mask)
        if "token_rewards" in batch:  # on-policy distillation: -weight x the reverse KL to the teacher, per token
            metrics["token_reward_mean"] = masked_mean(batch["token_rewards"], mask)
        return metrics
