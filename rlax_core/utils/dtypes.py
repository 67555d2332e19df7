"""Dtypes by the names configs and manifests use: one table for every part (the engine's cache, the
trainer's parameters, the weight store's tensors, the planner's and the fleet simulator's bytes)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

# The floating dtypes a config may name; bfloat16 is ml_dtypes', the one JAX uses (jnp.bfloat16).
FLOAT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
                "float16": np.dtype(np.float16)}


def dtype(name: Any) -> np.dtype:
    """A dtype by name (``"bfloat16"`` or any numpy name), or a dtype passed through."""
    if isinstance(name, str) and name in FLOAT_DTYPES:
        return FLOAT_DTYPES[name]
    return np.dtype(name)


def itemsize(name: Any) -> int:
    """Bytes of one element."""
    return dtype(name).itemsize


def is_float(value: np.dtype) -> bool:
    """Whether a stored tensor of this dtype is a weight to cast (token tables, counters and masks are not)."""
    return value.kind == "f" or value.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
