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

from rlax_core.utils.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "advantages": [
        "ADVANTAGE_ESTIMATORS", "AdvantageBatch", "compute_advantages", "discounted_returns", "gae",
        "register_advantage_estimator", "trained_mask", "value_targets",
    ],
    "aggregation": ["aggregate", "masked_mean", "token_weights"],
    "config": ["AlgorithmConfig"],
    "dynamic_sampling": ["has_reward_variance", "is_informative"],
    "group_filter": ["group_filter_mask"],
    "kl": ["kl_estimate"],
    "objective": ["log_importance_ratio", "mismatch_weights", "policy_loss", "value_loss"],
    "presets": ["PRESETS", "algorithm_from_dict", "get_preset", "register_preset"],
    "reward_shaping": ["overlong_penalty"],
})
