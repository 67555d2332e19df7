"""The update: PPO's epochs of optimizer steps on one batch, in one jitted graph, for one training
objective (``objective.py``: RL, SFT or DPO, chosen once per job; an ``AlgorithmConfig`` is the RL one).

Once per batch, before its first update, with the weights the batch arrived to (``prepare_batch``),
the trainer runs the forwards the objective asks for (the policy's ``old_logprobs``, the frozen
reference's ``ref_logprobs``, the critic's ``old_values``) and the objective's ``prepare`` turns them
into what its updates read (RL: advantages and returns, ``rl_objective.py``).

Then ``ppo_epochs`` passes over the batch, each of ``mini_batches`` optimizer updates, one per slice of
the batch (the same slices in every pass); each slice's gradient is accumulated over ``micro_batches``.
Slices and micro-batches take strided rows, so each spans every device. Per micro-batch::

    logprobs, entropy = log-softmax of the policy's float32 logits at the sampled tokens
    loss, metrics     = objective.loss(logprobs, entropy, micro-batch)
    value loss        = objective.value_loss(values, micro-batch), the critic's own gradient

Micro-batch gradients are summed, each micro-batch loss weighted by its share of its slice's token
weights (the objective's ``token_weights``), so that the accumulated gradient equals the gradient of
the slice's loss. Under pure data parallelism (the weights replicated, every other mesh axis 1) each
device sums its own rows' gradients over the micro-batches and the devices reduce them once per update,
as DDP's ``no_sync`` does, instead of once per micro-batch (``Trainer._micro_grads``). Then global-norm
clipping and AdamW (``optimizer.py``), for the policy and, with its own optimizer state, for the critic.

Usage::

    trainer = Trainer(model_config, algorithm, trainer_config, mesh)   # or a TrainingObjective
    state = trainer.init_state(params)              # sharded over the mesh (with a critic for PPO)
    state, metrics = trainer.step(state, batch)     # batch: numpy arrays from batching.make_batch

LoRA (``trainer.lora.rank > 0``): ``init_state(params)`` keeps ``params`` as the frozen base (the
trainer's ``base``, an input of every update that is never donated or written) and the state's
``params`` are the adapters alone, so the optimizer state, the gradients, the checkpoints and the
published versions are the adapters'. The policy's forward takes ``lora.merge(base, adapters)``, or
with ``trainer.lora.dropout > 0`` the adapters beside the kernels (``lora.with_adapters``: x @ W +
(x @ A) @ B, the adapter's input dropped per element with masks drawn from the step's key, one per
update and micro-batch); the reference policy of a KL term is the base itself, so it needs no ``ref_params``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax_core.models.attention import attention_for_platform, fits
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import adapter_logical_axes, init_adapters
from rlax_core.parallel.mesh import BATCH_AXES, replicated, tree_shardings
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.batch_layout import BatchLayout
from rlax_core.training.config import TrainerConfig
from rlax_core.training.frozen_base import FrozenBase
from rlax_core.training.layout import ForwardLayout
from rlax_core.training.heads import init_model, model_logical_axes, token_outputs, trainable_head, trainable_head_axes
from rlax_core.training.objective import TrainingObjective
from rlax_core.training.rl_objective import PolicyGradientObjective
from rlax_core.training.micro_batches import combine_metrics, join_micro_batches, split_micro_batches
from rlax_core.training.packing import MODEL_INPUTS, LaneShape, lane_shape, row_inputs, rows_to_samples
from rlax_core.training.optimizer import init_float32, learning_rate_schedule, make_optimizer, optimizer_shardings
from rlax_core.training.router_replay import RouterReplay
from rlax_core.training.state import TrainState
from rlax_core.training.value_model import init_value_params, token_values, value_logical_axes
from rlax_core.utils.dtypes import dtype as dtype_named


class Trainer:
    """The jitted update for one model, algorithm and mesh, and the state it updates."""

    def __init__(self, model_config: ModelConfig, objective: TrainingObjective | AlgorithmConfig,
                 config: TrainerConfig, mesh: Mesh):
        self.model_config = model_config
        self.objective = objective if isinstance(objective, TrainingObjective) else PolicyGradientObjective(objective)
        self.objective.check(config)
        self.algorithm = getattr(self.objective, "algorithm", None)  # the RL objective's
        self.config = config
        self.mesh = mesh
        self.param_dtype = dtype_named(config.param_dtype)
        self.optimizer = make_optimizer(config.optimizer)
        self.learning_rate = learning_rate_schedule(config.optimizer)
        self.updates_per_batch = config.ppo_epochs * config.mini_batches
        self.uses_value_model = self.objective.uses_values
        self.needs_old_logprobs = self.objective.scores_policy(self.updates_per_batch)
        self.lora, self.replay = config.lora, RouterReplay(model_config, self.objective.router_replay)
        self.batches = BatchLayout(config, mesh, pad_id=model_config.pad_token_id or 0, routed=self.replay.records)
        self.batch_shards, self.row_multiple = self.batches.batch_shards, self.batches.row_multiple
        self.lanes, self.rows_per_micro_batch = self.batches.lanes, self.batches.rows_per_micro_batch
        # ``pack`` (a padded batch as packed rows), ``put_batch`` (host -> mesh), ``micro_batches_of``.
        self.pack, self.put_batch, self.micro_batches_of = self.batches.pack, self.batches.put, \
            self.batches.micro_batches_of
        self._lanes_of = self.batches.lanes_of
        # Pure data parallelism (weights replicated, the batch split over devices): each device sums its
        # micro-batches' gradients and the devices reduce once per update (``_micro_grads``). LoRA
        # dropout keeps XLA's partitioning: its masks are drawn over the whole micro-batch.
        whole_weights = all(size == 1 for axis, size in mesh.shape.items() if axis != "data")
        self.accumulate_on_device = self.batch_shards > 1 and whole_weights and not config.lora.dropout
        platform = mesh.devices.flat[0].platform
        # Fused q/k/v and gate/up products (training.layout); LoRA's adapters are per projection.
        fusable = whole_weights and not config.lora.enabled
        if config.projections == "fused" and not fusable:
            raise ValueError("trainer.projections=fused needs whole weights on every device (mesh axes other than "
                             f"data of size 1, here {dict(mesh.shape)}) and no LoRA; use auto or separate")
        self.fuse_projections = fusable and (config.projections == "fused" or
                                             (config.projections == "auto" and platform == "cpu"))
        self.layout = ForwardLayout(model_config, scan_layers=config.scan_layers, fuse=self.fuse_projections)
        # The frozen base of a LoRA policy (its own object: how it is held and how the policy is made of it).
        self.frozen_base = FrozenBase(model_config, config, mesh) if config.lora.enabled else None
        # Whole-row attention: the chips' flash kernel (TPU splash, GPU cuDNN), dense XLA on CPU.
        self.attention = attention_for_platform(platform) if config.attention == "auto" else config.attention
        if config.row_tokens and not fits(self.attention, config.row_tokens):
            raise ValueError(f"trainer.row_tokens={config.row_tokens}: {self.attention} attention takes rows of a "
                             "multiple of 128 tokens")

        if self.lora.base_dtype == "int8" and self.uses_value_model:
            raise ValueError("trainer.lora.base_dtype=int8 with a value model: the critic would start from an "
                             "int8 backbone; use base_dtype=param")
        # The model's weights in the parameter dtype: the policy of full fine-tuning, and the critic's start.
        abstract_model = jax.eval_shape(lambda: self._cast_model(self._init_model(jax.random.key(0))))
        abstract_params = jax.eval_shape(lambda: self._cast_trainable(self._init_params(jax.random.key(0))))
        self.param_shardings = (tree_shardings(abstract_params, {**adapter_logical_axes(self.lora),
                                                                 **trainable_head_axes(model_config)}, mesh)
                                if self.lora.enabled else
                                tree_shardings(abstract_model, model_logical_axes(model_config), mesh))
        opt_shardings = optimizer_shardings(self.optimizer, abstract_params, self.param_shardings, mesh)
        value_shardings = value_opt_shardings = None
        if self.uses_value_model:
            self.value_optimizer = make_optimizer(config.value_model.optimizer)
            abstract_value = jax.eval_shape(init_value_params, abstract_model)
            value_shardings = tree_shardings(abstract_value, value_logical_axes(model_config), mesh)
            value_opt_shardings = optimizer_shardings(self.value_optimizer, abstract_value, value_shardings, mesh)
        self.value_param_shardings = value_shardings
        self.state_shardings = TrainState(step=replicated(mesh), params=self.param_shardings,
                                          opt_state=opt_shardings, rng=replicated(mesh),
                                          value_params=value_shardings, value_opt_state=value_opt_shardings)
        self._step = jax.jit(self._train_step, out_shardings=(self.state_shardings, replicated(mesh), replicated(mesh)),
                             donate_argnums=0)
        self._prepare = jax.jit(self._prepare_batch, out_shardings=replicated(mesh))
        self._totals = jax.jit(self._sequence_totals, out_shardings=replicated(mesh))
        self._gradients = jax.jit(self._loss_and_grads)

    def _init_model(self, rng):
        return init_model(self.model_config, rng, jnp.float32)

    def _cast_model(self, params):
        return jax.tree.map(lambda x: x.astype(self.param_dtype), params)

    def _init_params(self, rng):
        """Fresh trainable parameters: the whole model, or with LoRA the adapters."""
        if self.lora.enabled:
            return {**init_adapters(self.model_config, self.lora, rng), **trainable_head(self.model_config)}
        return self._init_model(rng)

    def _cast_trainable(self, params):
        # Adapters stay float32 whatever the base's dtype: they are small, and bfloat16 would round
        # away the low-rank updates; the merged kernels take the base's dtype.
        return jax.tree.map(lambda x: x.astype(jnp.float32), params) if self.lora.enabled else self._cast_model(params)

    @property
    def base(self) -> Any:
        """A LoRA policy's frozen base as held (None before it is loaded, and without LoRA)."""
        return None if self.frozen_base is None else self.frozen_base.params

    def load_base(self, params: Any) -> None:
        """Hold ``params`` (host or device arrays) as the frozen base of a LoRA policy (``FrozenBase.load``)."""
        if self.frozen_base is None:
            raise ValueError("load_base: trainer.lora.rank is 0 (full fine-tuning has no frozen base)")
        self.frozen_base.load(params)

    def policy_params(self, params: Any) -> Any:
        """The complete policy for the state's ``params``: with LoRA the base (dequantized when int8)
        with the adapters merged, in ``param_dtype``: what exports and full weight versions hold."""
        return params if self.frozen_base is None else self.frozen_base.complete(params)

    def _policy(self, params, base):
        """The policy as the training forward takes it."""
        return params if self.frozen_base is None else self.frozen_base.forward_policy(params, base)

    def _build_state(self, params, rng, base=None) -> TrainState:
        params = self._cast_trainable(params)
        value_params = value_opt_state = None
        if self.uses_value_model:
            value_params = init_value_params(base if self.lora.enabled else params)
            value_opt_state = init_float32(self.value_optimizer, value_params)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=init_float32(self.optimizer, params),
                          rng=jax.random.key_data(rng), value_params=value_params, value_opt_state=value_opt_state)

    def init_state(self, params: Any | None = None, *, seed: int | None = None) -> TrainState:
        """A fresh state: ``params`` (e.g. a pretrained model) or a random init from ``seed``. With a
        value-based estimator the critic starts as a copy of these parameters' backbone with a zero
        value head (``value_model.py``). With LoRA, ``params`` (random from ``seed`` when None) become
        the frozen base and the state starts from fresh adapters drawn from ``seed``."""
        seed = self.config.seed if seed is None else seed
        rng = jax.random.key(seed)
        init_rng, state_rng = jax.random.split(rng)
        if self.frozen_base is not None:
            self.frozen_base.load(self._init_model(init_rng) if params is None else params)
            return jax.jit(lambda base: self._build_state(self._init_params(init_rng), state_rng, base),
                           out_shardings=self.state_shardings)(self.base)
        if params is None:
            return jax.jit(lambda: self._build_state(self._init_params(init_rng), state_rng),
                           out_shardings=self.state_shardings)()
        params = jax.device_put(params, self.param_shardings)
        return jax.jit(lambda p: self._build_state(p, state_rng), out_shardings=self.state_shardings)(params)

    def abstract_state(self) -> TrainState:
        """Shapes, dtypes and shardings of the state, without materialising it (the restore target)."""
        abstract = jax.eval_shape(lambda: self._build_state(self._init_params(jax.random.key(0)), jax.random.key(0),
                                                            self._init_model(jax.random.key(0))))
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            abstract, self.state_shardings)

    def abstract_base(self) -> Any:
        """Shapes, dtypes and shardings of a LoRA policy's frozen base as the trainer holds it (int8
        kernels for QLoRA), without materialising it: ``lower_step(base=...)`` for ``rlax compile``."""
        if self.frozen_base is None:
            raise ValueError("abstract_base: trainer.lora.rank is 0 (full fine-tuning has no frozen base)")
        return self.frozen_base.abstract()

    # ------------------------------------------------------------------ the update

    def _reference(self, ref_params):
        """``ref_params`` as the update takes them: required with a KL term (LoRA: the base by default),
        dropped without one."""
        if not self.objective.uses_reference:
            return None
        if ref_params is None and self.lora.enabled:
            return self.base
        if ref_params is None:
            why = f"{self.algorithm.name}: kl_coef > 0" if self.algorithm is not None else self.objective.name
            raise ValueError(f"{why} needs ref_params (the reference policy)")
        return ref_params

    def _require_base(self):
        if self.frozen_base is not None:
            self.frozen_base.require()

    def _check_inputs(self, batch, ref_params):
        self._require_base()
        ref_params = self._reference(ref_params)
        if isinstance(next(iter(batch.values())), np.ndarray):
            batch = self.put_batch(batch)
        return batch, ref_params

    def compile_step(self, state: TrainState, rollouts: int, ref_params: Any | None = None) -> None:
        """Compile :meth:`step` for a batch of ``rollouts`` rows (as ``make_batch`` pads them) without
        running it: a job that knows its batch compiles while it waits for the first rollouts, and
        the first step then only runs. The state is read for its shapes alone (not donated)."""
        self.lower_step(state, rollouts, ref_params).compile()

    def lower_step(self, state: TrainState, rollouts: int, ref_params: Any | None = None,
                   base: Any | None = None, mean_tokens: int | None = None,
                   per_sample: tuple[str, ...] = ()) -> jax.stages.Lowered:
        """:meth:`step` lowered for a batch of ``rollouts`` rows; ``state``, ``ref_params`` and a LoRA
        policy's ``base`` (default: the loaded one) may be abstract (``abstract_state()``): ``rlax
        compile`` compiles it for a TPU slice it does not have. With ``trainer.row_tokens`` the batch
        is packed, its shape that of samples of ``mean_tokens`` (default: half of max_seq_len);
        ``per_sample`` names further float32 arrays of one value per sample the objective reads."""

        if base is None:
            self._require_base()
            base = self.base
        ref_params = self._reference(base if ref_params is None and self.lora.enabled else ref_params)
        batch = self.batches.abstract(rollouts, mean_tokens, per_sample)
        return self._step.lower(state, batch, ref_params, base)

    def step(self, state: TrainState, batch: dict[str, np.ndarray] | dict[str, jax.Array],
             ref_params: Any | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
        """One batch: ``ppo_epochs x mini_batches`` optimizer updates. ``ref_params`` are required when
        the algorithm has a KL term. Metrics are scalars over all of the batch's updates."""
        state, metrics, _ = self.step_with_update_metrics(state, batch, ref_params)
        return state, metrics

    def step_with_update_metrics(self, state: TrainState, batch, ref_params: Any | None = None):
        """As :meth:`step`, plus the metrics of each update: arrays ``[ppo_epochs, mini_batches]``."""
        batch, ref_params = self._check_inputs(batch, ref_params)
        return self._step(state, batch, ref_params, self.base)

    def prepare_batch(self, state: TrainState, batch, ref_params: Any | None = None) -> dict[str, jax.Array]:
        """What :meth:`step` computes once for this batch before its first update: the forwards the
        objective asks for and its ``prepare`` (RL: ``rl_objective``'s docstring)."""
        batch, ref_params = self._check_inputs(batch, ref_params)
        return self._prepare(state, batch, ref_params, self.base)

    def sequence_logprobs(self, batch, state: TrainState | None = None, ref_params: Any | None = None) -> jax.Array:
        """Each sample's total log-prob [S] of its ``loss_mask`` tokens, without a gradient: under the
        policy of ``state``, or else the reference (``ref_params``; with LoRA the base). Held-out NLL,
        and DPO's reference totals computed once."""
        self._require_base()
        params = self._policy(state.params, self.base) if state is not None else (
            self.base if ref_params is None and self.lora.enabled else ref_params)
        return self._totals(params, self.put_batch(batch) if isinstance(batch["tokens"], np.ndarray) else batch)

    def _sequence_totals(self, params, batch):
        lanes, params = lane_shape(batch, self._lanes_of(batch)), self.layout.to_forward(params)
        scored = self._forward_rows(lambda micro: {"lp": self._logprobs(params, micro, lanes, policy=False)[0]},
                                    {name: batch[name] for name in (*MODEL_INPUTS, "loss_mask") if name in batch})
        return jnp.sum(jnp.where(batch["loss_mask"] > 0, scored["lp"], 0.0), axis=-1)

    def _logprobs(self, params, micro, lanes, remat=False, dropout_key=None, on_device=False, policy=True):
        """Per sample [samples, T-1], however the rows hold them (``lanes``: see ``packing``).
        ``dropout_key``: the training forward's LoRA dropout masks (scoring passes give none: no dropout).
        ``on_device``: traced per device (``_micro_grads``), where the attention kernels need no mesh.
        ``policy``: the policy's forward, which replays the engine's experts (``router_replay``)."""
        logprobs, entropy = token_outputs(params, self.model_config, micro["tokens"], remat=remat,
                                           attention=self.attention, mesh=None if on_device else self.mesh,
                                           lora_dropout=self.lora.dropout, lora_dropout_rng=dropout_key,
                                           routed_experts=self.replay.routed_experts(micro) if policy else None,
                                           **row_inputs(micro))
        width = micro["loss_mask"].shape[1]
        return rows_to_samples(logprobs, micro, lanes, width), rows_to_samples(entropy, micro, lanes, width)

    def _values(self, value_params, micro, lanes: LaneShape | None, remat=False, on_device=False):
        values = token_values(value_params, self.model_config, micro["tokens"], remat=remat, attention=self.attention,
                              mesh=None if on_device else self.mesh, **row_inputs(micro))
        return rows_to_samples(values, micro, lanes, micro["loss_mask"].shape[1])

    def _forward_rows(self, fn, arrays: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """``fn(micro) -> dict of [rows, ...]`` over the batch in update-sized micro-batches (bounded memory)."""
        chunks = self.config.mini_batches * self.micro_batches_of(arrays)
        return join_micro_batches(jax.lax.map(lambda micro: fn(self._constrain(micro)),
                                              split_micro_batches(arrays, chunks)))

    def _constrain(self, arrays):
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
            x, NamedSharding(self.mesh, PartitionSpec(BATCH_AXES, *([None] * (x.ndim - 1))))), arrays)

    def _prepare_batch(self, state: TrainState, batch: dict[str, jax.Array], ref_params: Any,
                       base: Any = None) -> dict[str, jax.Array]:
        mask = batch["loss_mask"]
        policy, reference, critic = (self.layout.to_forward(p) for p in (self._policy(state.params, base), ref_params,
                                                                         state.value_params))

        lanes = lane_shape(batch, self._lanes_of(batch))

        def score(micro):
            out = {}
            if self.needs_old_logprobs:
                out["old_logprobs"], _ = self._logprobs(policy, micro, lanes)
            if reference is not None:
                out["ref_logprobs"], _ = self._logprobs(reference, micro, lanes, policy=False)
            if self.uses_value_model:
                out["old_values"] = self._values(critic, micro, lanes)
            out.update(self.replay.diagnostics(policy, micro, lanes, attention=self.attention, mesh=self.mesh))
            return out

        prepared = {}
        if self.needs_old_logprobs or ref_params is not None or self.uses_value_model or self.replay.diagnoses(batch):
            prepared = self._forward_rows(score, {name: batch[name] for name in (*MODEL_INPUTS, "loss_mask")
                                                  if name in batch})
        prepared = {name: jnp.where(mask > 0, x, 0.0) for name, x in prepared.items()}
        return {**prepared, **self.objective.prepare(batch, prepared)}

    def _policy_loss(self, params, micro, base=None, dropout_key=None, on_device=False, *, lanes=None):
        logprobs, entropy = self._logprobs(self._policy(params, base), micro, lanes, remat=self.config.remat,
                                           dropout_key=dropout_key, on_device=on_device)
        loss, metrics = self.objective.loss(logprobs, entropy, micro, one_update=self.updates_per_batch == 1)
        return loss * micro["share"], metrics

    def _micro_grads(self, loss_fn, params, micro, *args):
        """``((loss, metrics), grads)`` of ``loss_fn(params, micro, *args)`` on one micro-batch, its loss
        weighted by the micro-batch's share of its slice's token weights (see the module docstring).

        With ``accumulate_on_device`` each device takes the gradient of its own rows' part of the loss
        and keeps it, with a leading [devices] axis, so that the micro-batches' gradients are summed on
        the device and reduced across devices once per update: the shares make the parts add up to the
        micro-batch's loss under every ``loss_aggregation`` (the objective's ``token_weights``). The loss and metrics come per device too
        ([devices]), combined with the micro-batches' after the loop (the loss summed, the metrics as
        ``_combine_metrics`` does), so that nothing waits on another device within it. Otherwise XLA
        reduces each micro-batch's gradient as it partitions the batch: one all-reduce per micro-batch.
        """
        def weighted(micro):
            own = jnp.sum(self.objective.token_weights(micro["loss_mask"]))
            return {**micro, "share": jnp.sum(micro["slice_weights"]) / jnp.maximum(own, 1e-30)}

        if not self.accumulate_on_device:
            return jax.value_and_grad(loss_fn, has_aux=True)(params, weighted(micro), *args)

        def on_device(params, micro, *args):
            (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, weighted(micro), *args,
                                                                                on_device=True)
            return jax.tree.map(lambda x: x[None], ((loss, metrics), grads))

        rows, everywhere = PartitionSpec(BATCH_AXES), PartitionSpec()
        return jax.shard_map(on_device, mesh=self.mesh, in_specs=(everywhere, rows, *[everywhere] * len(args)),
                             out_specs=rows, check_vma=False)(params, micro, *args)

    def _value_loss(self, value_params, micro, on_device=False, *, lanes=None):
        values = self._values(value_params, micro, lanes, remat=self.config.remat, on_device=on_device)
        loss, metrics = self.objective.value_loss(values, micro, one_update=self.updates_per_batch == 1)
        return loss * micro["share"], metrics

    def _slice_grads(self, params, value_params, slice_, base, lanes, micro_batches, update_key):
        """The gradients (policy, critic) and metrics of one slice of the batch, over its micro-batches."""
        forward_params, forward_value_params = self.layout.to_forward(params), self.layout.to_forward(value_params)
        forward_base = self.layout.to_forward(base)
        slice_["slice_weights"] = self.objective.token_weights(slice_["loss_mask"])

        def accumulate(grad_sums, micro_and_key):
            micro, micro_key = micro_and_key
            micro = self._constrain(micro)
            (loss, metrics), grads = self._micro_grads(functools.partial(self._policy_loss, lanes=lanes),
                                                       forward_params, micro, forward_base, micro_key)
            policy_sum, value_sum = grad_sums
            policy_sum = jax.tree.map(lambda total, g: total + g.astype(jnp.float32), policy_sum, grads)
            metrics = {**metrics, "loss": loss}
            if self.uses_value_model:
                (loss, value_metrics), value_grads = self._micro_grads(functools.partial(self._value_loss, lanes=lanes),
                                                                       forward_value_params, micro)
                value_sum = jax.tree.map(lambda total, g: total + g.astype(jnp.float32), value_sum, value_grads)
                metrics.update(value_metrics, value_loss=loss)
            return (policy_sum, value_sum), metrics

        per_device = (self.batch_shards,) if self.accumulate_on_device else ()
        zeros = lambda tree: jax.tree.map(lambda p: jnp.zeros(per_device + p.shape, jnp.float32), tree)
        (grads, value_grads), metrics = jax.lax.scan(
            accumulate, (zeros(forward_params), zeros(forward_value_params)),
            (split_micro_batches(slice_, micro_batches), jax.random.split(update_key, micro_batches)))
        if self.accumulate_on_device:  # the update's one reduction across devices
            grads, value_grads = jax.tree.map(lambda g: jnp.sum(g, axis=0), (grads, value_grads))
        grads, value_grads = self.layout.to_state(grads), self.layout.to_state(value_grads)
        # Micro-batch losses are already weighted by their shares: their sum is the slice's loss.
        losses = {name: jnp.sum(metrics.pop(name)) for name in ("loss", "value_loss") if name in metrics}
        return grads, value_grads, {**combine_metrics(metrics), **losses}

    def _update(self, carry, slice_, base=None, lanes=None, micro_batches=1):
        """One optimizer update (policy, and critic) on one slice of the batch."""
        params, opt_state, value_params, value_opt_state, dropout_key = carry
        dropout_key, update_key = jax.random.split(dropout_key)
        grads, value_grads, metrics = self._slice_grads(params, value_params, slice_, base, lanes, micro_batches,
                                                        update_key)
        grads = jax.lax.with_sharding_constraint(grads, self.param_shardings)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.global_norm(grads)
        if self.uses_value_model:
            value_grads = jax.lax.with_sharding_constraint(value_grads, self.value_param_shardings)
            value_updates, value_opt_state = self.value_optimizer.update(value_grads, value_opt_state, value_params)
            value_params = optax.apply_updates(value_params, value_updates)
            metrics["value_grad_norm"] = optax.global_norm(value_grads)
        return (params, opt_state, value_params, value_opt_state, dropout_key), metrics

    def _update_inputs(self, state, batch, ref_params, base):
        prepared = self._prepare_batch(state, batch, ref_params, base)
        return prepared, {**self.objective.update_inputs(batch, prepared),
                          **{name: batch[name] for name in MODEL_INPUTS if name in batch}}

    def gradients(self, state: TrainState, batch, ref_params: Any | None = None) -> tuple[jax.Array, Any]:
        """The loss and the policy's gradient of the first update :meth:`step` would take on ``batch``
        (the whole batch as one slice: ``trainer.mini_batches`` 1), without taking it: what a test
        compares across layouts (padded, packed, micro-batched)."""
        if self.config.mini_batches != 1:
            raise ValueError("gradients: the batch is one slice only with trainer.mini_batches=1")
        batch, ref_params = self._check_inputs(batch, ref_params)
        return self._gradients(state, batch, ref_params, self.base)

    def _loss_and_grads(self, state, batch, ref_params, base):
        prepared, inputs = self._update_inputs(state, batch, ref_params, base)
        key = jax.random.split(jax.random.split(jax.random.wrap_key_data(state.rng))[1])[1]
        grads, _, metrics = self._slice_grads(state.params, state.value_params, inputs, base,
                                              lane_shape(batch, self._lanes_of(batch)), self.micro_batches_of(batch), key)
        return {**metrics, **self.objective.batch_metrics(batch, prepared)}["loss"], grads

    def _train_step(self, state: TrainState, batch: dict[str, jax.Array], ref_params: Any, base: Any):
        config = self.config
        prepared, inputs = self._update_inputs(state, batch, ref_params, base)
        slices = split_micro_batches(inputs, config.mini_batches)
        micro_batches, lanes = self.micro_batches_of(batch), lane_shape(batch, self._lanes_of(batch))

        def epoch(carry, _):
            return jax.lax.scan(functools.partial(self._update, base=base, lanes=lanes, micro_batches=micro_batches),
                                carry, slices)

        # One draw per step keeps the RNG stream reproducible across restarts; the step's other key
        # draws the LoRA dropout masks (one per update and micro-batch).
        next_rng, dropout_key = jax.random.split(jax.random.wrap_key_data(state.rng))
        carry = (state.params, state.opt_state, state.value_params, state.value_opt_state, dropout_key)
        (params, opt_state, value_params, value_opt_state, _), per_update = jax.lax.scan(
            epoch, carry, None, length=config.ppo_epochs)
        rng = jax.random.key_data(next_rng)

        metrics = combine_metrics(per_update)
        mask, sample_mask = batch["loss_mask"], batch["sample_mask"]
        num_samples = jnp.maximum(jnp.sum(sample_mask), 1.0)
        metrics.update(
            param_norm=optax.global_norm(params),
            learning_rate=self.learning_rate(state.step * self.updates_per_batch),
            completion_length_mean=jnp.sum(jnp.sum(mask, axis=1) * sample_mask) / num_samples,
            num_samples=jnp.sum(sample_mask),
            num_tokens=jnp.sum(mask),
        )
        metrics.update(self.replay.metrics(prepared, batch["behavior_logprobs"], mask))
        metrics.update(self.objective.batch_metrics(batch, prepared))
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=rng,
                               value_params=value_params, value_opt_state=value_opt_state)
        return new_state, metrics, per_update

