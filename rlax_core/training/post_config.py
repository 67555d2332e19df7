"""The post-training jobs' sections: ``sft:`` (``rlax sft``), ``dpo:`` (``rlax dpo``) and ``rm:`` (``rlax rm``).

Both run on the RL trainer's ``trainer:`` section (mesh, packing, micro-batches, LoRA, optimizer,
checkpoints, exports); these sections say what they read and how their loss is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlax_core.config import require


@dataclass(frozen=True)
class SftConfig:
    """Supervised fine-tuning on ``SftExample`` records (``rlax_core.data.records``)."""

    data: str = ""  # parquet or JSONL of SftExample records (local or gs://)
    # Held-out NLL: a file of its own, or else this share of ``data`` (chosen by record id, stable).
    validation_data: str = ""
    validation_fraction: float = 0.1
    # Which tokens the loss counts: ``completion`` (a record's completion; a chat's last assistant
    # turn), ``assistant`` (every assistant turn of a chat; the completion of a prompt + completion)
    # or ``sequence`` (every token after the first).
    loss_on: Literal["completion", "assistant", "sequence"] = "completion"
    # ``token_mean``: every trained token alike; ``sequence_mean``: every example alike (its tokens' mean).
    loss_aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    # An example longer than ``trainer.max_seq_len``: ``refuse`` (skipped, counted), ``truncate``
    # (its first max_seq_len tokens) or ``window`` (cut into windows of max_seq_len that overlap by
    # ``window_overlap`` tokens; each trained token is trained once).
    over_length: Literal["refuse", "truncate", "window"] = "refuse"
    window_overlap: int = 0
    examples_per_step: int = 16
    eval_every: int = 10  # held-out NLL every this many steps (and after the last)
    shuffle_seed: int = 0  # the order of examples: a pure function of (seed, epoch), so a resume replays it

    def __post_init__(self):
        require(0.0 <= self.validation_fraction < 1.0, "validation_fraction", "must lie in [0, 1)")
        require(self.window_overlap >= 0, "window_overlap", "must be >= 0")
        require(self.examples_per_step >= 1, "examples_per_step", "must be >= 1")
        require(self.eval_every >= 1, "eval_every", "must be >= 1")


@dataclass(frozen=True)
class DpoConfig:
    """Direct preference optimization on ``PreferencePair`` records."""

    data: str = ""  # parquet or JSONL of PreferencePair records
    validation_data: str = ""
    validation_fraction: float = 0.0  # held-out prompts (by prompt text, stable): all their pairs are held out
    loss: Literal["sigmoid", "ipo"] = "sigmoid"  # DPO's logistic loss, or IPO's squared one
    beta: float = 0.1
    label_smoothing: float = 0.0  # conservative DPO: the share of pairs assumed mislabelled (sigmoid only)
    sft_coef: float = 0.0  # > 0: plus this times the chosen completions' token-mean NLL (RPO)
    # The reference's log-probs: computed in each step by a frozen copy (``step``; with LoRA the
    # base), or ``precomputed`` once over the data before the first step and read with each batch.
    reference: Literal["step", "precomputed"] = "step"
    # A frozen reference other than the initial policy (a model folder of the same architecture);
    # empty: the initial policy (with LoRA: the base).
    reference_model: str = ""
    pairs_per_step: int = 8
    eval_every: int = 10
    shuffle_seed: int = 0

    def __post_init__(self):
        require(self.beta > 0, "beta", "must be > 0")
        require(0.0 <= self.label_smoothing < 0.5, "label_smoothing", "must lie in [0, 0.5)")
        require(self.sft_coef >= 0, "sft_coef", "must be >= 0")
        require(0.0 <= self.validation_fraction < 1.0, "validation_fraction", "must lie in [0, 1)")
        require(self.pairs_per_step >= 1, "pairs_per_step", "must be >= 1")
        require(self.eval_every >= 1, "eval_every", "must be >= 1")


@dataclass(frozen=True)
class RmConfig:
    """A Bradley-Terry reward model on ``PreferencePair`` records (``rlax rm``; ``training.bradley_terry``)."""

    data: str = ""  # parquet or JSONL of PreferencePair records (rlax rft's pairs-*.parquet, or users'); a
    # ``margin`` column, where present, is each pair's own margin
    validation_data: str = ""
    validation_fraction: float = 0.1  # held-out prompts (by prompt text, stable): all their pairs are held out
    margin: float = 0.0  # added to every pair's margin: -log sigmoid(s_c - s_r - margin)
    center_coefficient: float = 0.0  # TRL's center_rewards_coefficient: + coef * (s_c + s_r)^2
    pairs_per_step: int = 8
    eval_every: int = 10  # held-out pair accuracy every this many steps (and at step 0 and after the last)
    shuffle_seed: int = 0

    def __post_init__(self):
        require(0.0 <= self.validation_fraction < 1.0, "validation_fraction", "must lie in [0, 1)")
        require(self.center_coefficient >= 0, "center_coefficient", "must be >= 0")
        require(self.pairs_per_step >= 1, "pairs_per_step", "must be >= 1")
        require(self.eval_every >= 1, "eval_every", "must be >= 1")
