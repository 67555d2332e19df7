"""Named algorithm presets: each is an ``AlgorithmConfig`` holding a paper's published defaults.

    config = get_preset("dapo")                                   # the paper's settings
    config = get_preset("dapo", clip_eps_high=0.3)                # ... with a field changed
    config = algorithm_from_dict({"preset": "gspo", "kl_coef": 0.01})   # from a YAML section

Add one with::

    @register_preset("my_algo")
    def my_algo() -> AlgorithmConfig:
        return dataclasses.replace(get_preset("grpo"), name="my_algo", entropy_coef=1e-3)

Fields a preset does not set keep the ``AlgorithmConfig`` defaults. Lengths (``loss_max_length``,
``overlong_*``) are the paper's; a run with another generation budget should override them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from rlax_core.config import ConfigError, from_dict, to_dict
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.utils.registry import Registry

PRESETS: Registry = Registry("preset")  # name -> zero-argument function returning an AlgorithmConfig


def register_preset(name: str) -> Callable[[Callable[[], AlgorithmConfig]], Callable[[], AlgorithmConfig]]:
    """Decorator: make a zero-argument function returning an ``AlgorithmConfig`` selectable by ``name``."""
    return PRESETS.register(name)


def get_preset(name: str, **overrides: Any) -> AlgorithmConfig:
    """The preset ``name``, with ``overrides`` replacing single fields (validated again)."""
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown algorithm preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    config = PRESETS[name]()
    return dataclasses.replace(config, **overrides) if overrides else config


def algorithm_from_dict(data: Mapping[str, Any] | None, path: str = "algorithm") -> AlgorithmConfig:
    """Build from a config section: ``preset: NAME`` (omit it to spell every field out) plus field overrides."""
    data = dict(data or {})
    preset = data.pop("preset", None)
    try:
        base = {} if preset is None else to_dict(get_preset(preset))
    except ConfigError as error:
        raise error.under(path) from None
    return from_dict(AlgorithmConfig, {**base, **data}, path)


# An eight-bit rollout engine's log-probs drift further from the trainer's: what every peer that
# quantizes rollouts (verl, slime, NeMo-RL, SkyRL/FlashRL) corrects with token-level truncated
# importance sampling at C = 2, and what a run with such an engine gets unless it names a correction.
EIGHT_BIT_CORRECTION = {"mismatch_correction": "tis", "mismatch_level": "token", "mismatch_high": 2.0}


def corrected_for_engine(algorithm: AlgorithmConfig, eight_bit_engine: bool, named: Mapping[str, Any]) -> AlgorithmConfig:
    """``algorithm`` with ``EIGHT_BIT_CORRECTION`` where the engine is eight-bit and the run's
    ``algorithm`` section (``named``) sets none of its keys; else unchanged."""
    if not eight_bit_engine or set(EIGHT_BIT_CORRECTION) & set(named):
        return algorithm
    return dataclasses.replace(algorithm, **EIGHT_BIT_CORRECTION)


@register_preset("ppo")
def ppo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="ppo",
        advantage_estimator="gae",
        # GAE (Schulman et al. 2016, §3); gamma 1 and lambda 0.95 as in RLHF practice for whole-text rewards.
        gamma=1.0,
        gae_lambda=0.95,
        whiten_advantages=True,
        # PPO (Schulman et al. 2017, §3 eq. 7; eps = 0.2 is the best setting of §6.1, Table 1).
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        loss_aggregation="token_mean",
        # Per-token KL penalty in the reward (Ouyang et al. 2022, InstructGPT §3.5 eq. 2; Stiennon et al. 2020 §3.4).
        kl_coef=0.02,
        kl_estimator="k1",
        kl_in_reward=True,
        value_clip_eps=0.2,
    )


@register_preset("grpo")
def grpo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="grpo",
        # Group-standardised outcome reward (Shao et al. 2024, DeepSeekMath §4.1.2).
        advantage_estimator="grpo",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        # Eq. 3: mean over the tokens of each output, then over the G outputs.
        loss_aggregation="seq_mean_token_mean",
        # KL in the loss with the unbiased k3 estimator (§4.1.1 eq. 4); beta = 0.04 (§4.2).
        kl_coef=0.04,
        kl_estimator="k3",
    )


@register_preset("dapo")
def dapo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="dapo",
        advantage_estimator="grpo",
        # Clip-higher (Yu et al. 2025, DAPO §3.1): eps_low 0.2, eps_high 0.28.
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        # Dynamic sampling (§3.2).
        dynamic_sampling=True,
        # Token-level policy-gradient loss (§3.3).
        loss_aggregation="token_mean",
        # Overlong reward shaping (§3.4 eq. 13): 16384 expected + 4096 soft-punish cache (§4.1).
        overlong_max_length=20480,
        overlong_cache_length=4096,
        overlong_penalty=1.0,
        # No KL term (§2.3).
        kl_coef=0.0,
    )


@register_preset("dr_grpo")
def dr_grpo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="dr_grpo",
        # Liu et al. 2025, "Understanding R1-Zero-Like Training" §3.2: no std normalisation ...
        advantage_estimator="dr_grpo",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        # ... and no per-response length normalisation: sequence sums over a constant (the
        # generation budget; set loss_max_length to the run's max_new_tokens).
        loss_aggregation="seq_sum_norm",
        loss_max_length=4096,
        kl_coef=0.0,
    )


@register_preset("rloo")
def rloo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="rloo",
        # REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics" §3.3; Kool et al. 2019).
        advantage_estimator="rloo",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        loss_aggregation="seq_mean_token_mean",
        # The whole completion is one action; the KL penalty enters the reward (§2.1, §3).
        kl_coef=0.05,
        kl_estimator="k1",
        kl_in_reward=True,
    )


@register_preset("reinforce_pp")
def reinforce_pp() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="reinforce_pp",
        # REINFORCE++ (Hu 2025, §3): token-level KL penalty in the reward, return-to-go with gamma 1,
        # advantages normalised over the global batch; PPO's clipped surrogate on top.
        advantage_estimator="reinforce_pp",
        gamma=1.0,
        kl_coef=0.01,
        kl_estimator="k1",
        kl_in_reward=True,
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        loss_aggregation="token_mean",
    )


@register_preset("gspo")
def gspo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="gspo",
        advantage_estimator="grpo",
        # Sequence-level, length-normalised importance ratio (Zheng et al. 2025, GSPO §4.1 eq. 7) ...
        importance_ratio="sequence",
        # ... clipped at 3e-4 / 4e-4 (§5.1): sequence ratios move far less than token ratios.
        clip_eps_low=3e-4,
        clip_eps_high=4e-4,
        loss_aggregation="seq_mean_token_mean",
        kl_coef=0.0,
    )


@register_preset("gfpo")
def gfpo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="gfpo",
        # Shrivastava et al. 2025, GFPO §3: sample more (e.g. G = 16), keep the k shortest (k = 8 is one
        # of the §4 settings; reward_per_token is the token-efficiency variant), GRPO advantages on
        # the kept ones, the rest get 0.
        advantage_estimator="grpo",
        group_filter="length",
        group_filter_keep=8,
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        # The Phi-4-reasoning recipe GFPO builds on uses token-level normalisation (§1).
        loss_aggregation="token_mean",
        kl_coef=0.0,
    )


@register_preset("cispo")
def cispo() -> AlgorithmConfig:
    return AlgorithmConfig(
        name="cispo",
        advantage_estimator="grpo",
        # CISPO (MiniMax 2025, MiniMax-M1 §3.1 eq. 4-5): a clipped, stop-gradient IS weight on the
        # REINFORCE term. No lower bound (eps_low = 1 puts it at 0, §3.1); the paper tunes the
        # upper bound without publishing it: 1 + 3 = 4 is the truncation of ScaleRL (Khatri et al. 2025).
        policy_loss="cispo",
        clip_eps_low=1.0,
        clip_eps_high=3.0,
        # Token-level normalisation over the batch, as in DAPO (§3.1).
        loss_aggregation="token_mean",
        kl_coef=0.0,
    )
