"""The training objective: what one trainer job learns, chosen once, behind one interface.

The trainer (``step.Trainer``) owns the machinery every objective shares: the mesh, packed rows and
their read-back into the sample layout, token-budget micro-batches, LoRA, the optimizer, the
compiled update. The objective owns the arithmetic that differs, in four places::

    prepare(batch, scored)       once per batch, on all of it: from the forwards the trainer ran
                                 (``scored``: the policy's, the reference's, the critic's log-probs or
                                 values, as ``scores_policy``/``uses_reference``/``uses_values`` ask)
                                 to what the updates need (RL: advantages; DPO: each sample's
                                 coefficient)
    update_inputs(batch, prep)   the per-sample arrays the updates read; ``loss_mask`` among them
    token_weights(mask)          each token's share of a slice's loss: micro-batch gradients are
                                 weighted by it, so that their sum is the slice's gradient
    loss(logprobs, entropy, m)   one micro-batch's loss from the policy's log-probs [S, T-1]
    batch_metrics(batch, prep)   the step's metrics beside the trainer's own

Objectives (``OBJECTIVES``, one name each): ``rl`` (``rl_objective``: the policy objective of
``rlax_core.rl`` with an algorithm), ``sft`` (``supervised``: the negative log-likelihood of the
trained tokens), ``dpo`` (``preference``: DPO and IPO on chosen and rejected samples) and ``rm``
(``bradley_terry``: a reward model on chosen/rejected pairs). The reward model runs the same rows;
its model puts out a score per position where a language model puts out log-probs (``heads``).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax

from rlax_core.utils.registry import Registry

OBJECTIVES = Registry("training objective")
Arrays = Mapping[str, jax.Array]


class TrainingObjective:
    """The interface (see the module docstring); the defaults are those of an objective that needs
    nothing before its updates."""

    name: str = ""
    uses_values: bool = False  # trains a critic beside the policy (PPO's GAE); ``value_loss`` then
    uses_reference: bool = False  # ``prepare`` reads a frozen reference's log-probs (``ref_logprobs``)
    router_replay: bool = False  # the policy's forward runs the experts the engine recorded

    def scores_policy(self, updates_per_batch: int) -> bool:
        """Whether ``prepare`` reads the policy's own log-probs (``old_logprobs``) before the updates."""
        return False

    def check(self, trainer_config: Any) -> None:
        """Refuse, in one line, a trainer configuration this objective cannot train under."""

    def prepare(self, batch: Arrays, scored: Arrays) -> dict[str, jax.Array]:
        return {}

    def update_inputs(self, batch: Arrays, prepared: Arrays) -> dict[str, jax.Array]:
        return {"loss_mask": batch["loss_mask"]}

    def token_weights(self, mask: jax.Array) -> jax.Array:
        raise NotImplementedError

    def loss(self, logprobs: jax.Array, entropy: jax.Array, micro: Arrays, *,
             one_update: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
        raise NotImplementedError

    def value_loss(self, values: jax.Array, micro: Arrays, *, one_update: bool):
        raise NotImplementedError(f"the {self.name} objective trains no critic")

    def batch_metrics(self, batch: Arrays, prepared: Arrays) -> dict[str, jax.Array]:
        return {}
