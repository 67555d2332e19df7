"""``TrainerConfig``: every knob of the update, the mesh, checkpoints and the train job.

Built like every other section (see ``rlax_core.config``): a frozen dataclass validated on
construction, loadable from YAML under the ``trainer:`` key with dotted overrides
(``trainer.optimizer.learning_rate=1e-5``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rlax_core.config import require
from rlax_core.models.lora_config import LoraConfig
from rlax_core.parallel.config import MeshConfig
from rlax_core.utils.wandb_logger import WandbConfig


@dataclass(frozen=True)
class OptimizerConfig:
    """optax AdamW with warmup then cosine decay (or constant), after global-norm clipping."""

    learning_rate: float = 1e-5
    schedule: Literal["cosine", "constant"] = "constant"
    warmup_steps: int = 0
    decay_steps: int = 1000  # cosine: steps from the end of warmup to ``min_lr_ratio * learning_rate``
    min_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0

    def __post_init__(self):
        require(self.learning_rate > 0, "learning_rate", "must be > 0")
        require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        require(self.decay_steps >= 1, "decay_steps", "must be >= 1")
        require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", "must lie in [0, 1]")
        require(0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0, "b1", "b1 and b2 must lie in [0, 1)")
        require(self.eps > 0, "eps", "must be > 0")
        require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")


@dataclass(frozen=True)
class ValueModelConfig:
    """PPO's critic (``rlax_core.training.value_model``), trained only when the advantage estimator
    needs values (``gae``): initialised from the policy's backbone with a zero value head, updated
    with PPO's (clipped: ``algorithm.value_clip_eps``) value loss by its own optimizer."""

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)


@dataclass(frozen=True)
class TrainerConfig:
    """The trainer: the update, sharding, checkpoints, and how the job reads rollouts."""

    REMOVED: ClassVar[dict[str, str]] = {
        "startup_wait_s": "moved: the trainer's first wait covers loop.startup_budget_s, the fleet's start-up; set that"}

    seed: int = 0
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    # The update: ``groups_per_step`` rollout groups form one batch. PPO passes over it
    # ``ppo_epochs`` times; each pass takes ``mini_batches`` optimizer steps, one per equal slice of
    # the batch; each slice is split into ``micro_batches`` whose gradients are accumulated.
    groups_per_step: int = 8
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batches: int = 1
    max_seq_len: int = 128  # prompt + completion tokens, at most, of one sample
    # Packed rows (training.packing): > 0 packs samples back to back into rows of this many tokens
    # (>= max_seq_len), each lane's rows and sample slots rounded up to ``row_buckets_per_octave``
    # sizes per doubling (a compile per bucket, not per step). 0: one sample per row, padded to
    # max_seq_len (one compile).
    row_tokens: int = 0
    row_buckets_per_octave: int = 8
    # Micro-batches by tokens (with row_tokens): each device's part of a micro-batch holds this many
    # tokens (micro_batch_tokens // row_tokens rows) and a slice takes as many micro-batches as its
    # tokens fill (bucketed); it replaces micro_batches. 0: micro_batches.
    micro_batch_tokens: int = 0
    # Packed rows: while it waits for the first rollouts, the trainer compiles the update for batches
    # of samples of these mean token counts (prompt + completion), in order, on a background thread; a
    # step whose batch falls in one of their buckets reuses it (training.compile_ahead).
    # A guess above max_seq_len counts as max_seq_len (compile_ahead_means), so a run that shortens the
    # samples keeps its recipe's guesses. (): none.
    compile_ahead_tokens: tuple[int, ...] = ()
    remat: bool = False  # recompute activations in the backward pass (less memory, more FLOPs)
    # Whole-row attention: "auto" is the chips' flash kernel (TPU: Pallas splash, GPU: cuDNN) and dense
    # XLA on CPU; "dense" keeps [heads, T, T] scores per layer on any chip (rlax_core.models.attention).
    attention: Literal["auto", "dense", "splash", "cudnn"] = "auto"
    # False: run the layers unrolled (models.unstack_layers inside the step) instead of as one scan.
    # Faster for shallow models on CPU (no per-layer weight slices or stacked activations); the
    # compile time then grows with depth. The state keeps the stacked layout either way.
    scan_layers: bool = True
    # "fused": each layer's q/k/v and gate/up as one product each inside the step
    # (models.fuse_projections): the same numbers with three fewer products per layer, forward and
    # backward, for a transient fused copy of those weights and their gradients. It needs whole
    # weights on every device (pure data parallelism) and no LoRA. "auto": fused on CPU where that
    # holds (small products, where a product's fixed cost counts: stories260K's update 8-20% faster).
    projections: Literal["auto", "fused", "separate"] = "auto"
    value_model: ValueModelConfig = field(default_factory=ValueModelConfig)  # used by value-based estimators
    # LoRA (rank > 0): the trainer learns adapters on a frozen base (rlax_core.models.lora), holds
    # optimizer state for the adapters only, and the reference policy is the base itself.
    lora: LoraConfig = field(default_factory=LoraConfig)
    # The job.
    total_steps: int = 100
    max_staleness: int = 1  # accept rollouts of weight version >= step - max_staleness
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    async_checkpointing: bool = True
    publish_every: int = 1  # weight versions kept: weights.keep (the parameter server's config)
    # A Hugging Face folder (OUTPUT/hf/step_XXXXXXXX/) every this many steps; 0: after the last step only.
    export_every: int = 0
    wandb: WandbConfig = field(default_factory=WandbConfig)  # Weights & Biases beside TensorBoard (optional extra)
    # How long to wait for rollout groups before failing loudly; the first wait of ``rlax train`` also
    # covers the fleet's start-up (loop.startup_budget_s).
    wait_timeout_s: float = 600.0
    poll_s: float = 0.5

    def __post_init__(self):
        require(self.groups_per_step >= 1, "groups_per_step", "must be >= 1")
        require(self.ppo_epochs >= 1, "ppo_epochs", "must be >= 1")
        require(self.mini_batches >= 1, "mini_batches", "must be >= 1")
        require(self.micro_batches >= 1, "micro_batches", "must be >= 1")
        require(self.max_seq_len >= 2, "max_seq_len", "must be >= 2")
        require(self.row_tokens == 0 or self.row_tokens >= self.max_seq_len, "row_tokens",
                f"must be 0 (padded rows) or >= max_seq_len={self.max_seq_len}, so that every sample fits a row")
        require(self.row_buckets_per_octave >= 1, "row_buckets_per_octave", "must be >= 1")
        require(not self.compile_ahead_tokens or self.row_tokens > 0, "compile_ahead_tokens",
                "is for packed rows (row_tokens > 0); padded rows compile ahead by themselves")
        require(all(t >= 1 for t in self.compile_ahead_tokens), "compile_ahead_tokens",
                f"mean tokens of a sample, each >= 1, got {list(self.compile_ahead_tokens)}")
        require(self.micro_batch_tokens == 0 or (self.row_tokens > 0 and self.micro_batch_tokens >= self.row_tokens),
                "micro_batch_tokens", f"must be 0 or >= row_tokens={self.row_tokens} (> 0: micro-batches of packed rows)")
        require(self.micro_batch_tokens == 0 or self.micro_batches == 1, "micro_batches",
                "is set by micro_batch_tokens: leave it at 1")
        require(self.total_steps >= 1, "total_steps", "must be >= 1")
        require(self.max_staleness >= 0, "max_staleness", "must be >= 0")
        require(self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
        require(self.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1")
        require(self.publish_every >= 1, "publish_every", "must be >= 1")
        require(self.export_every >= 0, "export_every", "must be >= 0 (0: export after the last step only)")
        require(self.wait_timeout_s > 0, "wait_timeout_s", "must be > 0")
        require(self.poll_s > 0, "poll_s", "must be > 0")

    @property
    def compile_ahead_means(self) -> tuple[int, ...]:
        """``compile_ahead_tokens`` within the sample length, in order: no batch's mean exceeds
        ``max_seq_len``, so a larger guess is that one."""
        return tuple(min(tokens, self.max_seq_len) for tokens in self.compile_ahead_tokens)
