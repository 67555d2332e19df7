"""``trainer.lora``: which projections take low-rank adapters, of what rank and scale, over what base.

A config only, without JAX: ``pipelines.config`` reads it for every job, ``rlax curate`` among them,
which never builds a model. The adapters themselves (their shapes, initialisation, merging, the
int8 base) are ``rlax_core.models.lora``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from rlax_core.config import require

# target name -> (its path inside a layer, its kernel's input and output logical axes)
TARGETS: Mapping[str, tuple[tuple[str, str], tuple[str, ...], tuple[str, ...]]] = {
    "q": (("attn", "q_proj"), ("embed",), ("heads", "head_dim")),
    "k": (("attn", "k_proj"), ("embed",), ("kv_heads", "head_dim")),
    "v": (("attn", "v_proj"), ("embed",), ("kv_heads", "head_dim")),
    "o": (("attn", "o_proj"), ("heads", "head_dim"), ("embed",)),
    "gate": (("mlp", "gate_proj"), ("embed",), ("mlp",)),
    "up": (("mlp", "up_proj"), ("embed",), ("mlp",)),
    "down": (("mlp", "down_proj"), ("mlp",), ("embed",)),
}


@dataclass(frozen=True)
class LoraConfig:
    """``trainer.lora``: rank 0 (the default) is full fine-tuning."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    # "param": the frozen base in the trainer's param_dtype; "int8": QLoRA, every projection kernel held
    # as int8 with a float32 scale per output channel (``quantize_kernels``), dequantized in the forward.
    base_dtype: str = "param"

    def __post_init__(self):
        require(self.rank >= 0, "rank", "must be >= 0 (0: full fine-tuning)")
        require(self.alpha > 0, "alpha", "must be > 0")
        require(0.0 <= self.dropout < 1.0, "dropout", "must lie in [0, 1): the chance of dropping an adapter input")
        require(len(self.targets) > 0, "targets", f"name at least one of {', '.join(TARGETS)}")
        unknown = [t for t in self.targets if t not in TARGETS]
        require(not unknown, "targets", f"unknown {unknown}; choose from {', '.join(TARGETS)}")
        require(len(set(self.targets)) == len(self.targets), "targets", "lists a target twice")
        require(self.base_dtype in ("param", "int8"), "base_dtype", "must be param (the trainer's param_dtype) or int8")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def on_the_fly(self) -> bool:
        """Whether the trainer's forward runs the adapters beside the kernels instead of merging them:
        dropout needs it, and an int8 base must not be materialised merged."""
        return self.enabled and (self.dropout > 0 or self.base_dtype == "int8")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "LoraConfig":
        return cls(rank=int(raw["rank"]), alpha=float(raw["alpha"]), dropout=float(raw.get("dropout", 0.0)),
                   targets=tuple(raw["targets"]))
