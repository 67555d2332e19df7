"""The policy update: one optimizer step on one batch of rollout groups, in one jitted graph.

Inside the graph, for each micro-batch (strided rows of the batch, so every device holds part of
every micro-batch):

    logprobs, entropy = log-softmax of the policy's float32 logits at the sampled tokens
    old_logprobs      = stop_gradient(logprobs)      one update per batch: pi_old is pi, ratio == 1.0
    ref_logprobs      = the frozen reference policy's, when the algorithm has a KL term
    loss, metrics     = rlax_core.rl.policy_loss(...)  (advantages from rlax_core.rl.compute_advantages
                                                       over the whole batch, before the split)

Micro-batch gradients are summed, each micro-batch loss weighted by its share of the whole batch's
token weights, so that the accumulated gradient equals the gradient of the whole-batch loss under
every ``loss_aggregation``. Then global-norm clipping and AdamW (``optimizer.py``).

Usage::

    trainer = Trainer(model_config, algorithm, trainer_config, mesh)
    state = trainer.init_state(params)              # sharded over the mesh
    state, metrics = trainer.step(state, batch)     # batch: numpy arrays from batching.make_batch
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import forward, param_logical_axes
from rlax_core.rl.advantages import compute_advantages
from rlax_core.rl.aggregation import token_weights
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.objective import policy_loss
from rlax_core.training.config import TrainerConfig
from rlax_core.training.mesh import BATCH_AXES, batch_sharding, replicated, tree_shardings
from rlax_core.training.optimizer import learning_rate_schedule, make_optimizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@flax.struct.dataclass
class TrainState:
    """Everything a checkpoint must hold to continue bit for bit."""

    step: jax.Array  # int32: optimizer updates taken
    params: Any
    opt_state: Any
    rng: jax.Array  # uint32 key data (raw, so that any checkpoint format can hold it)


def token_logprobs(params, config: ModelConfig, tokens, attention_mask, *, remat: bool = False):
    """log pi(token t+1 | tokens <= t) and the entropy of that distribution, both [B, T-1] float32."""
    logits = forward(params, config, tokens, attention_mask=attention_mask, remat=remat)[:, :-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    # A one-hot contraction rather than a gather: its gradient is a dense multiply, where a gather's
    # is a scatter into [B, T, V], which XLA runs slowly on CPU.
    chosen = jnp.einsum("btv,btv->bt", log_probs, jax.nn.one_hot(tokens[:, 1:], log_probs.shape[-1], dtype=log_probs.dtype))
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return chosen, entropy


def split_micro_batches(batch: dict[str, jax.Array], num: int) -> dict[str, jax.Array]:
    """[B, ...] -> [num, B / num, ...], micro-batch m holding rows m, m + num, m + 2 num, ...

    Strided rather than contiguous: the rows of a device are contiguous, so each micro-batch keeps
    rows on every device and no device idles.
    """
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // num, num, *x.shape[1:]), 0, 1), batch)


def _combine_metrics(stacked: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Per-micro-batch metrics [M] -> one value each (min of mins, max of maxes, sum of counts, else mean)."""
    out = {}
    for name, values in stacked.items():
        if name.endswith("_min"):
            out[name] = jnp.min(values)
        elif name.endswith("_max"):
            out[name] = jnp.max(values)
        elif name.startswith("num_"):
            out[name] = jnp.sum(values)
        else:
            out[name] = jnp.mean(values)
    return out


class Trainer:
    """The jitted update for one model, algorithm and mesh, and the state it updates."""

    def __init__(self, model_config: ModelConfig, algorithm: AlgorithmConfig, config: TrainerConfig, mesh: Mesh):
        if algorithm.uses_values:
            raise ValueError(f"advantage_estimator {algorithm.advantage_estimator!r} needs a value model, "
                             "which this trainer does not have yet; use a group estimator (grpo, rloo, ...)")
        if algorithm.kl_in_reward and algorithm.kl_coef > 0:
            raise ValueError("kl_in_reward is not supported by this trainer yet; keep the KL in the loss")
        self.model_config = model_config
        self.algorithm = algorithm
        self.config = config
        self.mesh = mesh
        self.param_dtype = DTYPES[config.param_dtype]
        self.optimizer = make_optimizer(config.optimizer)
        self.learning_rate = learning_rate_schedule(config.optimizer)
        self.batch_shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
        self.row_multiple = self.batch_shards * config.micro_batches

        abstract_params = jax.eval_shape(
            lambda: jax.tree.map(lambda x: x.astype(self.param_dtype), self._init_params(jax.random.key(0))))
        self.param_shardings = tree_shardings(abstract_params, param_logical_axes(model_config), mesh)
        abstract_opt = jax.eval_shape(self.optimizer.init, abstract_params)
        # Optimizer moments mirror the parameters and are sharded like them; counters are replicated.
        opt_shardings = optax.tree_map_params(self.optimizer, lambda _, sharding: sharding, abstract_opt,
                                              self.param_shardings, transform_non_params=lambda _: replicated(mesh))
        self.state_shardings = TrainState(step=replicated(mesh), params=self.param_shardings,
                                          opt_state=opt_shardings, rng=replicated(mesh))
        self._step = jax.jit(self._train_step, out_shardings=(self.state_shardings, replicated(mesh)),
                             donate_argnums=0)

    # ------------------------------------------------------------------ state

    def _init_params(self, rng):
        from rlax_core.models.transformer import init_params

        return init_params(self.model_config, rng, jnp.float32)

    def init_state(self, params: Any | None = None, *, seed: int | None = None) -> TrainState:
        """A fresh state: ``params`` (e.g. a pretrained model) or a random init from ``seed``."""
        seed = self.config.seed if seed is None else seed
        rng = jax.random.key(seed)
        init_rng, state_rng = jax.random.split(rng)

        def build(params):
            params = jax.tree.map(lambda x: x.astype(self.param_dtype), params)
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params),
                              rng=jax.random.key_data(state_rng))

        if params is None:
            return jax.jit(lambda: build(self._init_params(init_rng)), out_shardings=self.state_shardings)()
        params = jax.device_put(params, self.param_shardings)
        return jax.jit(build, out_shardings=self.state_shardings)(params)

    def abstract_state(self) -> TrainState:
        """Shapes, dtypes and shardings of the state, without materialising it (the restore target)."""
        def build():
            params = jax.tree.map(lambda x: x.astype(self.param_dtype), self._init_params(jax.random.key(0)))
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params),
                              rng=jax.random.key_data(jax.random.key(0)))

        abstract = jax.eval_shape(build)
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            abstract, self.state_shardings)

    # ------------------------------------------------------------------ the update

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host arrays -> global arrays split over the batch axes (each process supplies its own rows)."""
        rows = next(iter(batch.values())).shape[0]
        if rows % self.row_multiple:
            raise ValueError(f"batch of {rows} rows does not split into {self.batch_shards} device shards x "
                             f"{self.config.micro_batches} micro-batches; pad it with make_batch(row_multiple=...)")

        def put(x):
            sharding = batch_sharding(self.mesh, x.ndim)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

        return {name: put(np.asarray(x)) for name, x in batch.items()}

    def step(self, state: TrainState, batch: dict[str, np.ndarray] | dict[str, jax.Array],
             ref_params: Any | None = None) -> tuple[TrainState, dict[str, float]]:
        """One optimizer update. ``ref_params`` are required when the algorithm has a KL term."""
        if self.algorithm.uses_reference and ref_params is None:
            raise ValueError(f"{self.algorithm.name}: kl_coef > 0 needs ref_params (the reference policy)")
        if isinstance(next(iter(batch.values())), np.ndarray):
            batch = self.put_batch(batch)
        state, metrics = self._step(state, batch, ref_params if self.algorithm.uses_reference else None)
        return state, metrics

    def _train_step(self, state: TrainState, batch: dict[str, jax.Array], ref_params: Any):
        algorithm, config = self.algorithm, self.config
        mask = batch["loss_mask"]
        advantages = compute_advantages(algorithm, batch["rewards"], mask, group_ids=batch["group_ids"],
                                        sample_mask=batch["sample_mask"])
        whole_weights = token_weights(mask, algorithm.loss_aggregation, algorithm.loss_max_length)
        inputs = dict(tokens=batch["tokens"], attention_mask=batch["attention_mask"], loss_mask=mask,
                      behavior_logprobs=batch["behavior_logprobs"], advantages=advantages,
                      whole_weights=whole_weights)
        micro_batches = split_micro_batches(inputs, config.micro_batches)

        def micro_loss(params, micro):
            logprobs, entropy = token_logprobs(params, self.model_config, micro["tokens"], micro["attention_mask"],
                                               remat=config.remat)
            ref_logprobs = None
            if ref_params is not None:
                ref_logprobs, _ = token_logprobs(ref_params, self.model_config, micro["tokens"],
                                                 micro["attention_mask"])
                ref_logprobs = jax.lax.stop_gradient(ref_logprobs)
            if algorithm.entropy_coef == 0:
                entropy = jax.lax.stop_gradient(entropy)
            loss, metrics = policy_loss(algorithm, logprobs, jax.lax.stop_gradient(logprobs), micro["advantages"],
                                        micro["loss_mask"], ref_logprobs=ref_logprobs,
                                        behavior_logprobs=micro["behavior_logprobs"], entropy=entropy)
            # This micro-batch's part of the whole-batch loss (see the module docstring).
            own = jnp.sum(token_weights(micro["loss_mask"], algorithm.loss_aggregation, algorithm.loss_max_length))
            share = jnp.sum(micro["whole_weights"]) / jnp.maximum(own, 1e-30)
            return loss * share, metrics

        def accumulate(grad_sum, micro):
            micro = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
                x, NamedSharding(self.mesh, PartitionSpec(BATCH_AXES, *([None] * (x.ndim - 1))))), micro)
            (loss, metrics), grads = jax.value_and_grad(micro_loss, has_aux=True)(state.params, micro)
            grad_sum = jax.tree.map(lambda total, g: total + g.astype(jnp.float32), grad_sum, grads)
            return grad_sum, (loss, metrics)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        grads, (losses, metrics) = jax.lax.scan(accumulate, zeros, micro_batches)
        grads = jax.lax.with_sharding_constraint(grads, self.param_shardings)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # One draw per step keeps the RNG stream reproducible across restarts (nothing samples yet).
        rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0])

        metrics = _combine_metrics(metrics)
        sample_mask = batch["sample_mask"]
        num_samples = jnp.maximum(jnp.sum(sample_mask), 1.0)
        lengths = jnp.sum(mask, axis=1)
        metrics.update(
            loss=jnp.sum(losses),
            grad_norm=optax.global_norm(grads),
            param_norm=optax.global_norm(params),
            learning_rate=self.learning_rate(state.step),
            reward_mean=jnp.sum(batch["rewards"] * sample_mask) / num_samples,
            completion_length_mean=jnp.sum(lengths * sample_mask) / num_samples,
            num_samples=jnp.sum(sample_mask),
        )
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=rng)
        return new_state, metrics
