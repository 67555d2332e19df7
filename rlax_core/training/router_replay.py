"""Router replay (R3) in the trainer, and how far the trainer's routing is from the engine's.

A mixture of experts makes a discrete choice per token and layer. The engine and the trainer compute
the router's logits with different programs (a decode step against a KV cache, a whole-row forward;
other kernels, other summation orders, and in RL often other weights by a rounding), so a near-tie
between two experts can fall one way in the engine and the other in the trainer. The trainer's
log-probs then belong to another network than the one that sampled the tokens, and the importance
ratios the objective divides by are off by far more than rounding. With ``algorithm.router_replay``
the trainer's policy forward runs the experts the engine recorded (``Completion.routed_experts``,
carried by the rollout rows and the batch as ``routed_experts``) instead of its own top k; their
weights are still its router's probabilities, so the router learns through the experts chosen.

Which positions: every position of prompt + completion the trainer's forward runs. The prompt's ids
come from the engine's prefill, each generated token's from the decode step that fed it. The last
token is never fed to the engine; its ids (zeros) act only on its own logits, which predict nothing.

Only the policy replays: the reference policy and a critic route by their own routers (their
weights are not the engine's, so there is no engine choice to reuse).

Diagnostics, with replay on: two more forwards without gradients per batch, the policy's own routing
and the replayed one, give

  routing_agreement           the fraction of recorded (token, sparse layer, slot) experts that are
                              among the trainer's own top k, over the tokens the loss scores
  logprob_mismatch_no_replay  mean |log pi_trainer - log pi_engine| over those tokens, own routing
  logprob_mismatch_replay     the same with the engine's experts replayed

With replay off they are not run, and batches do not carry the ids (``records`` is None): a sparse
model's batch then costs no forward more than a dense one's. To measure how far the trainer's routing
is from the engine's before turning replay on, turn it on for a step: the diagnostics report the
mismatch without replay too.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import forward_with_routing
from rlax_core.rl.aggregation import masked_mean
from rlax_core.training.batching import RoutedExperts
from rlax_core.training.logprobs import layer_major, logprobs_of_logits, token_logprobs
from rlax_core.training.packing import LaneShape, row_inputs, rows_to_samples

DIAGNOSTICS = ("routing_agreement", "logprob_mismatch_no_replay", "logprob_mismatch_replay")


class RouterReplay:
    """What the trainer does with the engine's routed experts: replay them (``replay``: ``algorithm.router_replay``)
    and measure the agreement and the log-prob mismatch (the module docstring)."""

    def __init__(self, model_config: ModelConfig, replay: bool):
        if replay and model_config.moe is None:
            raise ValueError("algorithm.router_replay: the model is dense (no mixture of experts, no routing to "
                             "replay); set it to false")
        self.model_config = model_config
        self.enabled = replay
        # How batches hold the ids (None: a dense model, or replay off; their batches carry none).
        self.records = RoutedExperts.of(model_config, required=True) if self.enabled else None

    def routed_experts(self, rows: Mapping[str, jax.Array]) -> jax.Array | None:
        """The ids the policy's forward runs [B, T, moe_layers, k]: the recorded ones when replaying."""
        return rows["routed_experts"] if self.enabled else None

    def diagnoses(self, batch: Mapping[str, jax.Array]) -> bool:
        """Whether the step runs the diagnostics' two forwards: replaying, on a batch with the ids."""
        return self.enabled and "routed_experts" in batch

    def diagnostics(self, params, rows: Mapping[str, jax.Array], lanes: LaneShape | None, **options
                    ) -> dict[str, jax.Array]:
        """Per sample [samples, T-1] (``rows_to_samples``): the share of its recorded experts the
        trainer's own router picks at each position, and its log-probs without and with replay; none
        for rows without recorded experts. ``options``: the forward's (attention, mesh)."""
        if not self.diagnoses(rows):
            return {}
        config, tokens, recorded = self.model_config, rows["tokens"], rows["routed_experts"]
        logits, routing = forward_with_routing(params, config, tokens, **options, **row_inputs(rows))
        own_logprobs, _ = logprobs_of_logits(logits, tokens)
        replayed, _ = token_logprobs(params, config, tokens, **options, **row_inputs(rows), routed_experts=recorded)
        # Order within the top k does not matter to the forward (each expert keeps its weight).
        chosen = (layer_major(recorded)[..., :, None] == routing.expert_ids[..., None, :]).any(axis=-1)
        agreement = jnp.mean(chosen.astype(jnp.float32), axis=(0, 3))[:, :-1]  # [B, T-1]: position t's logits
        width = rows["loss_mask"].shape[1]
        per_sample = lambda values: rows_to_samples(values, rows, lanes, width)  # noqa: E731
        return {"routing_agreement": per_sample(agreement), "logprobs_no_replay": per_sample(own_logprobs),
                "logprobs_replay": per_sample(replayed)}

    @staticmethod
    def metrics(prepared: Mapping[str, jax.Array], behavior_logprobs: jax.Array, mask: jax.Array
                ) -> dict[str, jax.Array]:
        """The batch's ``DIAGNOSTICS`` over the tokens ``mask`` scores; none when it was not diagnosed."""
        if "routing_agreement" not in prepared:
            return {}
        mismatch = lambda logprobs: masked_mean(jnp.abs(logprobs - behavior_logprobs), mask)  # noqa: E731
        return {"routing_agreement": masked_mean(prepared["routing_agreement"], mask),
                "logprob_mismatch_no_replay": mismatch(prepared["logprobs_no_replay"]),
                "logprob_mismatch_replay": mismatch(prepared["logprobs_replay"])}
