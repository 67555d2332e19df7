"""``TrainState``: what the trainer updates, and what a checkpoint holds (``checkpoint.py``)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
    """Everything a checkpoint must hold to continue bit for bit."""

    step: jax.Array  # int32: batches trained; each took ppo_epochs x mini_batches optimizer updates
    params: Any  # the policy's trainable parameters: all of them, or with LoRA the adapters
    opt_state: Any
    rng: jax.Array  # uint32 key data (raw, so that any checkpoint format can hold it)
    value_params: Any = None  # PPO's critic (value_model.py); None without a value-based estimator
    value_opt_state: Any = None
