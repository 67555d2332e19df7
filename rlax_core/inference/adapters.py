"""An adapter version on the engine's base: merged into its kernels, or beside them to run on the fly.

    params = apply_adapters(base, adapters, lora, "on_the_fly", model_config=config, mesh=None, device=None)

``base`` is the engine's decoding layout of a full version (``programs.decoding_layout`` on one
device, ``programs.tensor_parallel_layout`` over a mesh); ``adapters`` the stacked tree of
``models.lora`` (what an adapter weight version holds). Both modes give the same tokens and
log-probs (``tests/inference/test_adapter_engine.py``); which is faster is measured by
``benchmarks/adapter_serving.py``.

- "merged": W + alpha / rank * A @ B per adapted kernel, once per version. A decode step then costs
  the base model's; the engine holds the base's adapted kernels and the merged ones.
- "on_the_fly": the base's own arrays, with each adapter's A and B (scale folded into B) beside
  the kernel it adapts; every step adds (x @ A) @ B per adapted projection. Nothing is merged or
  copied at the swap.

On one device the adapters are fused like the base's projections (q/k/v, gate/up: block-diagonal
B, ``lora.decoding_adapters``); under tensor parallelism they stay apart like the kernels and are
split by the same logical-axis rules (A by its kernel's input axes, B by its output axes).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
from jax.sharding import SingleDeviceSharding

from rlax_core.inference import programs
from rlax_core.inference.sharding import decoding_adapter_shardings
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import adapted_kernels, with_adapters, with_kernels
from rlax_core.models.lora_config import LoraConfig


def apply_adapters(base: Any, adapters: Any, lora: LoraConfig, mode: Literal["merged", "on_the_fly"], *,
                   model_config: ModelConfig, mesh=None, device: jax.Device | None = None) -> Any:
    """The engine's params for ``adapters`` on ``base`` (see the module docstring)."""
    laid_out = decoding_layout(adapters, lora, model_config=model_config, mesh=mesh, device=device)
    if mode == "on_the_fly":
        return with_adapters(base, laid_out)
    kernels = adapted_kernels(base, laid_out)
    merged = programs.merge_adapters(kernels, laid_out)
    if mesh is not None:  # each merged kernel placed as its base kernel: the programs compiled for that
        merged = jax.device_put(merged, jax.tree.map(lambda x: x.sharding, kernels))
    return with_kernels(base, merged)


def decoding_layout(adapters: Any, lora: LoraConfig, *, model_config: ModelConfig, mesh=None,
                    device: jax.Device | None = None) -> Any:
    """The adapters per layer with the scale folded in, on the base's device(s)."""
    if mesh is None:
        if device is not None:
            adapters = jax.device_put(adapters, device)
        return _laid_out(adapters, lora, model_config, mesh)
    laid_out = _laid_out(adapters, lora, model_config, mesh)
    return jax.device_put(laid_out, decoding_adapter_shardings(lora, laid_out, mesh))


def abstract_adapted_params(base: Any, adapters: Any, lora: LoraConfig, mode: Literal["merged", "on_the_fly"], *,
                            model_config: ModelConfig, mesh=None, device: jax.Device | None = None) -> Any:
    """``apply_adapters``' result as shapes, dtypes and shardings (``jax.ShapeDtypeStruct``), from
    abstract ``base`` (with shardings) and ``adapters``: what the engine's programs are compiled for
    (``compile.programs``). Merged kernels are laid out as the base's own: merged, that is the base."""
    if mode == "merged":
        return base
    laid_out = jax.eval_shape(functools.partial(_laid_out, lora=lora, model_config=model_config, mesh=mesh), adapters)
    shardings = (jax.tree.map(lambda _: SingleDeviceSharding(device or jax.devices()[0]), laid_out) if mesh is None
                 else decoding_adapter_shardings(lora, laid_out, mesh))
    return with_adapters(base, jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                            laid_out, shardings))


def _laid_out(adapters: Any, lora: LoraConfig, model_config: ModelConfig, mesh) -> Any:
    # One device fuses the adapters like the base's projections; a mesh keeps them apart like its kernels.
    return programs.adapter_layout(adapters, model_config=model_config, lora=lora, fuse=mesh is None)
