"""``FrozenBase``: a LoRA policy's frozen base as the trainer holds it, and the policy made of it.

With ``trainer.lora.rank > 0`` the trainer learns adapters on weights it never changes. This object
holds those weights (in ``trainer.param_dtype``, their kernels int8 with float32 scales for QLoRA),
places them on the trainer's mesh by the model's rules, and forms the policy from them:

    base = FrozenBase(model_config, trainer_config, mesh)
    base.load(pretrained_params)                 # or base.init(rng): a random one
    base.forward_policy(adapters, base.params)   # inside the jitted update: merged, or beside the kernels
    base.complete(adapters)                      # the whole policy (dequantized, merged): exports, versions

The base is an input of every update (``Trainer.step`` passes ``base.params``), never donated or
written, so that one copy serves every step; a KL term's reference policy is the base itself.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import (dequantize_kernels, merge, quantize_kernels, quantized_logical_axes, scaled,
                                   with_adapters)
from rlax_core.training.heads import init_model, model_logical_axes, split_head
from rlax_core.parallel.mesh import tree_shardings
from rlax_core.training.config import TrainerConfig
from rlax_core.utils.dtypes import dtype as dtype_named


class FrozenBase:
    """The frozen weights of a LoRA policy on ``mesh``; ``params`` is None until :meth:`load`."""

    def __init__(self, model_config: ModelConfig, config: TrainerConfig, mesh: Mesh):
        if not config.lora.enabled:
            raise ValueError("FrozenBase: trainer.lora.rank is 0 (full fine-tuning has no frozen base)")
        self.model_config, self.lora, self.mesh = model_config, config.lora, mesh
        self.param_dtype = dtype_named(config.param_dtype)
        self._given_axes = model_logical_axes(model_config)
        axes = quantized_logical_axes(self._given_axes) if self.lora.base_dtype == "int8" else self._given_axes
        self._abstract = jax.eval_shape(lambda: self.held(init_model(model_config, jax.random.key(0), jnp.float32)))
        self.shardings = tree_shardings(self._abstract, axes, mesh)
        self.params: Any = None

    def held(self, params: Any) -> Any:
        """``params`` as the base is held: in ``param_dtype``, its kernels int8 for QLoRA."""
        params = jax.tree.map(lambda x: x.astype(self.param_dtype), params)
        return quantize_kernels(params) if self.lora.base_dtype == "int8" else params

    def load(self, params: Any) -> None:
        """Hold ``params`` (host or device arrays) as the base, sharded by the model's rules."""
        params = jax.device_put(params, tree_shardings(params, self._given_axes, self.mesh))
        self.params = jax.jit(self.held, out_shardings=self.shardings)(params)

    def init(self, rng: jax.Array) -> None:
        """Hold a random base (tests, benchmarks)."""
        self.load(init_model(self.model_config, rng, jnp.float32))

    def require(self) -> Any:
        if self.params is None:
            raise ValueError("LoRA: no frozen base; call init_state(params) or load_base(params) first")
        return self.params

    def abstract(self) -> Any:
        """Shapes, dtypes and shardings of the base as held, without materialising it (``rlax compile``)."""
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self._abstract,
                            self.shardings)

    def forward_policy(self, adapters: Any, base: Any) -> Any:
        """The policy as the training forward takes it (traced inside the update: ``base`` is its input).
        With dropout the adapters run beside the kernels (dropout masks the adapters' inputs, which a
        merged W' cannot; an int8 base stays int8); else they are merged. A trained head (a reward
        model's score) takes the base's place."""
        adapters, head = split_head(adapters)
        if self.lora.on_the_fly:
            return {**with_adapters(base, scaled(adapters, self.lora)), **head}
        return {**merge(base, adapters, self.lora), **head}

    def complete(self, adapters: Any) -> Any:
        """The whole policy, the base (dequantized when int8) with the adapters merged, in
        ``param_dtype``: what exports and full weight versions hold."""
        base = self.require()
        if self.lora.base_dtype == "int8":
            base = dequantize_kernels(base, self.param_dtype)
        adapters, head = split_head(adapters)
        return {**merge(base, adapters, self.lora), **jax.tree.map(lambda x: x.astype(self.param_dtype), head)}
