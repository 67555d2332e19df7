"""RL algorithms on arrays: advantage estimators, the unified policy objective, presets.

Nothing here knows about models: the trainer hands in per-token log-probs ``[B, T]`` of the current,
old, reference and behaviour (inference-engine) policies, a completion mask ``[B, T]``, rewards with
their group layout, and (PPO) values. A train step looks like::

    from rlax_core import rl

    config = rl.get_preset("dapo")                       # or rl.algorithm_from_dict(yaml["algorithm"])
    advantages = rl.compute_advantages(config, rewards, mask, group_ids=group_ids)

    def loss_fn(params):
        logprobs, entropy = model_logprobs(params, batch)            # float32
        old = jax.lax.stop_gradient(logprobs)                        # first step on this batch: ratio == 1
        return rl.policy_loss(config, logprobs, old, advantages, mask,
                              behavior_logprobs=batch["behavior_logprobs"], entropy=entropy)

Modules: ``config`` (AlgorithmConfig), ``advantages`` (estimator registry, GAE), ``objective``
(policy_loss, value_loss, TIS/MIS weights), ``aggregation`` (token weighting), ``kl`` (k1/k2/k3),
``group_filter`` (GFPO), ``dynamic_sampling`` (DAPO's rule for a group worth training on),
``reward_shaping`` (DAPO's overlong penalty), ``presets`` (named published defaults). The rewards
arrive shaped: the rollout stream applies DAPO's overlong shaping and dynamic sampling to each
scored group as ``AlgorithmConfig`` says (``rlax_core.rollout.groups``).
"""

from rlax_core.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageBatch,
    compute_advantages,
    discounted_returns,
    gae,
    register_advantage_estimator,
    trained_mask,
    value_targets,
)
from rlax_core.rl.aggregation import aggregate, masked_mean, token_weights
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.dynamic_sampling import has_reward_variance, is_informative
from rlax_core.rl.group_filter import group_filter_mask
from rlax_core.rl.kl import kl_estimate
from rlax_core.rl.objective import log_importance_ratio, mismatch_weights, policy_loss, value_loss
from rlax_core.rl.presets import PRESETS, algorithm_from_dict, get_preset, register_preset
from rlax_core.rl.reward_shaping import overlong_penalty

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageBatch",
    "AlgorithmConfig",
    "PRESETS",
    "aggregate",
    "algorithm_from_dict",
    "compute_advantages",
    "trained_mask",
    "discounted_returns",
    "gae",
    "get_preset",
    "group_filter_mask",
    "has_reward_variance",
    "is_informative",
    "kl_estimate",
    "log_importance_ratio",
    "masked_mean",
    "mismatch_weights",
    "overlong_penalty",
    "policy_loss",
    "register_advantage_estimator",
    "register_preset",
    "token_weights",
    "value_loss",
    "value_targets",
]
