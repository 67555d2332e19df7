"""``AlgorithmConfig``: every knob of the policy objective and the advantage estimators, in one place.

A preset (``rlax_core.rl.presets``) is just an ``AlgorithmConfig`` with a paper's defaults; a run
picks one by name and may override single fields (``algorithm.clip_eps_high=0.3``). The config is
frozen and hashable, so it is passed to jitted functions as a static argument.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Literal, Optional

from rlax_core.config import require

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"]
RatioLevel = Literal["token", "sequence"]
PolicyLossKind = Literal["clipped", "cispo"]
KLEstimator = Literal["k1", "k2", "k3"]
MismatchCorrection = Literal["none", "tis", "mis"]
GroupFilter = Literal["none", "length", "reward_per_token"]

# The estimators ``rlax_core.rl.advantages`` registers (tests/rl/test_advantages.py holds the two lists
# equal): a config checks its estimator's name without importing them, and with them JAX, which a job
# that only reads configs (``rlax curate``) has no use for.
BUILT_IN_ESTIMATORS = ("dr_grpo", "gae", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo")


def known_estimators() -> list[str]:
    """The estimator names a config may select: the built-in ones, and any that a user module has
    registered (which imported ``rlax_core.rl.advantages`` to do so)."""
    advantages = sys.modules.get("rlax_core.rl.advantages")
    return sorted({*BUILT_IN_ESTIMATORS, *(advantages.ADVANTAGE_ESTIMATORS if advantages else ())})


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """The RL algorithm: how advantages are estimated and how the policy loss is formed.

    Fields are grouped by concern; each group's comment says which function reads it.
    """

    name: str = "custom"  # the preset it came from; informational (logged with the run)

    # --- advantages (compute_advantages) --------------------------------------------------------
    advantage_estimator: str = "grpo"  # a name in rlax_core.rl.advantages.ADVANTAGE_ESTIMATORS
    std_eps: float = 1e-6  # added to a standard deviation before dividing by it
    gamma: float = 1.0  # GAE discount
    gae_lambda: float = 1.0  # GAE lambda
    whiten_advantages: bool = False  # GAE: normalise advantages to zero mean, unit std over the batch's tokens

    # --- GFPO group filtering (compute_advantages) ----------------------------------------------
    group_filter: GroupFilter = "none"  # rank the samples of a group by this ...
    group_filter_keep: int = 0  # ... and keep the best k; the others get advantage 0

    # --- DAPO dynamic sampling and overlong shaping (the rollout stream: rollout.groups) --------
    # Drop groups whose task rewards are all equal; the trainer fills its batch from later groups.
    dynamic_sampling: bool = False
    # Add DAPO's soft overlong punishment of each completion's length to its reward: 0 up to
    # L_max - L_cache tokens, down to -overlong_penalty at L_max, and -overlong_penalty past it.
    overlong_max_length: int = 0  # L_max; 0 turns the shaping off
    overlong_cache_length: int = 0  # L_cache: the soft-penalty band just below L_max
    overlong_penalty: float = 1.0  # the penalty reached at L_max (DAPO: 1)

    # --- the policy loss (policy_loss) ----------------------------------------------------------
    policy_loss: PolicyLossKind = "clipped"  # PPO-style clipped surrogate, or CISPO
    importance_ratio: RatioLevel = "token"  # per token, or GSPO's per-sequence geometric mean
    clip_eps_low: float = 0.2  # ratio (or CISPO weight) lower bound is 1 - clip_eps_low
    clip_eps_high: float = 0.2  # ratio (or CISPO weight) upper bound is 1 + clip_eps_high
    dual_clip_c: Optional[float] = None  # dual-clip: bound negative-advantage losses by c * |A|; c > 1
    loss_aggregation: Aggregation = "seq_mean_token_mean"
    loss_max_length: int = 0  # the constant divisor of "seq_sum_norm" (the generation budget)

    # --- regularisers (policy_loss / compute_advantages) ----------------------------------------
    kl_coef: float = 0.0  # weight of the KL to the reference policy; 0 turns it off
    kl_estimator: KLEstimator = "k3"
    kl_in_reward: bool = False  # subtract kl_coef * KL from the rewards instead of adding it to the loss
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * entropy

    # --- training-inference mismatch (policy_loss) ----------------------------------------------
    mismatch_correction: MismatchCorrection = "none"  # TIS truncates, MIS (icepop) masks
    mismatch_level: RatioLevel = "token"
    mismatch_low: float = 0.0  # MIS: weights below this are masked (TIS ignores it)
    mismatch_high: float = 2.0  # TIS: weights are truncated here; MIS: weights above it are masked
    # A mixture of experts (the trainer's forward, training.router_replay): run the experts the engine
    # recorded for each token instead of the trainer's own top k (R3). A dense model refuses it.
    router_replay: bool = False

    # --- the value model (value_loss) -----------------------------------------------------------
    value_clip_eps: Optional[float] = None  # PPO value clipping around the old values; None: unclipped

    def __post_init__(self):
        estimators = known_estimators()
        require(self.advantage_estimator in estimators, "advantage_estimator",
                f"one of {', '.join(estimators)}, got {self.advantage_estimator!r}")
        require(self.std_eps >= 0, "std_eps", "a number >= 0")
        require(0 <= self.gamma <= 1, "gamma", "a number in [0, 1]")
        require(0 <= self.gae_lambda <= 1, "gae_lambda", "a number in [0, 1]")
        require(self.group_filter_keep >= 0, "group_filter_keep", "an integer >= 0")
        require(
            (self.group_filter == "none") == (self.group_filter_keep == 0),
            "group_filter_keep",
            "> 0 exactly when group_filter is not 'none' (how many samples of a group to keep)",
        )
        require(self.overlong_max_length >= 0, "overlong_max_length", "an integer >= 0 (0: off)")
        require(
            0 <= self.overlong_cache_length <= self.overlong_max_length or self.overlong_max_length == 0,
            "overlong_cache_length",
            "an integer in [0, overlong_max_length]",
        )
        require(self.overlong_penalty >= 0, "overlong_penalty", "a number >= 0")
        require(0 <= self.clip_eps_low <= 1, "clip_eps_low", "a number in [0, 1] (the lower bound 1 - eps must be >= 0)")
        require(self.clip_eps_high >= 0, "clip_eps_high", "a number >= 0")
        require(self.dual_clip_c is None or self.dual_clip_c > 1, "dual_clip_c", "null or a number > 1")
        require(
            self.dual_clip_c is None or self.policy_loss == "clipped",
            "dual_clip_c",
            "null unless policy_loss is 'clipped' (CISPO has no clipped surrogate to bound)",
        )
        require(
            self.loss_aggregation != "seq_sum_norm" or self.loss_max_length > 0,
            "loss_max_length",
            "> 0 when loss_aggregation is 'seq_sum_norm' (the constant length that divides each sequence sum)",
        )
        require(self.loss_max_length >= 0, "loss_max_length", "an integer >= 0")
        require(self.kl_coef >= 0, "kl_coef", "a number >= 0")
        require(self.entropy_coef >= 0, "entropy_coef", "a number >= 0")
        require(self.mismatch_low >= 0, "mismatch_low", "a number >= 0")
        require(self.mismatch_high > max(self.mismatch_low, 0), "mismatch_high", "a number > mismatch_low and > 0")
        require(self.value_clip_eps is None or self.value_clip_eps > 0, "value_clip_eps", "null or a number > 0")

    @property
    def uses_reference(self) -> bool:
        """Whether the trainer must compute reference-policy log-probs."""
        return self.kl_coef > 0

    @property
    def uses_values(self) -> bool:
        """Whether the estimator needs a value model (PPO's critic)."""
        from rlax_core.rl.advantages import ADVANTAGE_ESTIMATORS

        return ADVANTAGE_ESTIMATORS[self.advantage_estimator].needs_values
