"""PPO's value model (the critic): the policy's transformer with a scalar head in place of the classifier.

A separate critic, initialised from the policy's backbone with a zero value head, as verl, OpenRLHF
and InstructGPT do, rather than a second head on the policy's own backbone:

* the value loss cannot pull the policy's features around (a shared backbone needs a value-loss
  coefficient tuned against the policy loss; separate models need none);
* the critic keeps its own optimizer (``trainer.value_model.optimizer``: usually a larger learning
  rate than the policy's) and its own gradient clipping;
* the zero head makes every initial value 0 (no arbitrary baseline before the critic has seen a
  return); the head's gradient is the backbone's features, so it starts learning at once and the
  backbone follows.

The price is a second set of weights and Adam moments, sharded by the same partition rules.

Parameters are ``{"backbone": <the policy's tree without lm_head>, "value_head": {"kernel": [hidden],
"bias": []}}``. ``token_values`` aligns with the trainer's per-token arrays: position t holds
V(tokens <= t), the value of the state in which token t + 1 is chosen.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import hidden_states, param_logical_axes

Params = dict[str, Any]


def init_value_params(policy_params: Params) -> Params:
    """A critic from the policy's parameters: the same backbone (copied), a zero value head."""
    backbone = {name: jax.tree.map(jnp.copy, tree) for name, tree in policy_params.items() if name != "lm_head"}
    embedding = backbone["embed_tokens"]["embedding"]
    head = {"kernel": jnp.zeros(embedding.shape[-1:], embedding.dtype), "bias": jnp.zeros((), embedding.dtype)}
    return {"backbone": backbone, "value_head": head}


def value_logical_axes(config: ModelConfig) -> Params:
    """Logical axis names of the critic's tree (leaves are tuples), for the trainer's partition rules."""
    backbone = {name: axes for name, axes in param_logical_axes(config).items() if name != "lm_head"}
    return {"backbone": backbone, "value_head": {"kernel": ("embed",), "bias": ()}}


def token_values(value_params: Params, config: ModelConfig, tokens, attention_mask=None, *, remat: bool = False,
                 attention: str = "dense", mesh=None, segment_ids=None, positions=None):
    """V(tokens <= t) for t < T - 1: [B, T-1] float32, aligned with ``token_logprobs`` and ``loss_mask``
    (packed rows: ``segment_ids`` and ``positions`` as ``token_logprobs`` takes them)."""
    hidden = hidden_states(value_params["backbone"], config, tokens, attention_mask=attention_mask, remat=remat,
                           attention=attention, mesh=mesh, segment_ids=segment_ids, positions=positions)[:, :-1]
    head = value_params["value_head"]
    # float32 like the policy's logits: the values are regression outputs feeding GAE.
    return (jnp.einsum("bte,e->bt", hidden.astype(jnp.float32), head["kernel"].astype(jnp.float32))
            + head["bias"].astype(jnp.float32))
