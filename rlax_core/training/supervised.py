"""The ``sft`` training objective: the negative log-likelihood of the tokens a batch's loss mask marks.

Which tokens are marked is the data's business (``sft_data``: a completion, every assistant turn
of a chat, or the whole sequence); the objective only averages ``-log pi(token)`` over them, as
``sft.loss_aggregation`` says: ``token_mean`` (every trained token alike, as TRL and MaxText do)
or ``sequence_mean`` (each example's mean, then the mean over examples: a short example counts as
much as a long one). The weights are ``rlax_core.rl.aggregation``'s, so micro-batches, packed rows
and devices add up to the batch's loss exactly as they do for the RL objective.
"""

from __future__ import annotations

import jax.numpy as jnp

from rlax_core.rl.aggregation import aggregate, token_weights
from rlax_core.training.objective import OBJECTIVES, TrainingObjective

AGGREGATIONS = {"token_mean": "token_mean", "sequence_mean": "seq_mean_token_mean"}


@OBJECTIVES.register("sft")
class SupervisedObjective(TrainingObjective):
    name = "sft"

    def __init__(self, loss_aggregation: str = "token_mean"):
        if loss_aggregation not in AGGREGATIONS:
            raise ValueError(f"sft.loss_aggregation={loss_aggregation!r}: expected one of {', '.join(AGGREGATIONS)}")
        self.mode = AGGREGATIONS[loss_aggregation]

    def token_weights(self, mask):
        return token_weights(mask, self.mode)

    def loss(self, logprobs, entropy, micro, *, one_update):
        mask = micro["loss_mask"]
        nll = aggregate(-logprobs, mask, self.mode)
        # How often the trained token is the policy's most likely one is not read here: the forward
        # gives log-probs of the targets only. Perplexity is exp of the held-out NLL (the job's).
        return nll, {"entropy_mean": jnp.sum(jnp.where(mask > 0, entropy, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)}
