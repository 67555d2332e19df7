"""The optimizer: optax AdamW on a warmup-then-cosine (or constant) schedule, after global-norm clipping."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from rlax_core.parallel.mesh import replicated
from rlax_core.training.config import OptimizerConfig


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Linear warmup from 0 to ``learning_rate``, then cosine decay or constant."""
    peak = config.learning_rate
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=config.warmup_steps,
            decay_steps=config.warmup_steps + config.decay_steps, end_value=peak * config.min_lr_ratio)
    if config.warmup_steps == 0:
        return optax.constant_schedule(peak)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, config.warmup_steps), optax.constant_schedule(peak)],
        boundaries=[config.warmup_steps])


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(learning_rate_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay)
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)


def init_float32(optimizer: optax.GradientTransformation, params):
    """Optimizer state in float32 whatever the parameter dtype: bfloat16 Adam moments lose the small
    updates, and the float32 gradients would turn them into float32 after one update anyway (a state
    whose dtypes drift cannot be carried through the update loop or restored exactly)."""
    return optimizer.init(jax.tree.map(lambda x: x.astype(jnp.float32), params))


def optimizer_shardings(optimizer: optax.GradientTransformation, abstract_params, param_shardings, mesh):
    """The shardings of ``optimizer``'s state: moments mirror the parameters and are sharded like them,
    counters are replicated over ``mesh``."""
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    return optax.tree_map_params(optimizer, lambda _, sharding: sharding, abstract_opt, param_shardings,
                                 transform_non_params=lambda _: replicated(mesh))
