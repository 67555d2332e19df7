"""The programs a role runs, lowered for a device slice from abstract inputs (shapes and shardings).

Each builder reuses the role's own code: the trainer's update is ``Trainer.lower_step`` of the
``Trainer`` that ``rlax train`` builds (its mesh, remat, micro-batches and dtypes), and the engine's
programs are ``inference.programs``' prefill (one per prompt bucket, at the largest prefill batch)
and decode, with the weights, KV pool and slot state laid out as ``Engine`` lays them out (a LoRA
run's engine: the base with an adapter version applied as ``engine.lora_mode`` resolves, as
``Engine.update_adapters`` applies it). Nothing is materialised: a 32B model's programs lower on a laptop.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from rlax_core.inference import programs as inference_programs
from rlax_core.inference.adapters import abstract_adapted_params
from rlax_core.inference.config import EngineConfig
from rlax_core.inference.batch import SlotState
from rlax_core.inference.kv_cache import init_kv_cache
from rlax_core.inference.placement import kernels_for, lora_mode_for
from rlax_core.inference.sampling import SamplingMode
from rlax_core.inference.sharding import decoding_param_shardings, engine_mesh, kv_pool_sharding
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import init_adapters, quantize_kernels
from rlax_core.models.lora_config import LoraConfig
from rlax_core.models.transformer import init_params, unstack_layers
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.config import TrainerConfig
from rlax_core.training.objective import TrainingObjective
from rlax_core.parallel.mesh import make_mesh
from rlax_core.training.step import Trainer
from rlax_core.utils.dtypes import dtype as dtype_named


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program of a role: ``lower()`` gives JAX's ``Lowered`` for the role's devices."""

    role: str
    name: str
    lower: Callable[[], jax.stages.Lowered]
    sampling_mode: SamplingMode | None = None  # None: the program is the same whatever the role samples with
    held: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (dtype, shape on one chip) of the pools and weights


def _abstract(tree: Any, shardings: Any, dtype=None) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, dtype or x.dtype, sharding=s), tree, shardings)


def trainer_programs(model: ModelConfig, algorithm: AlgorithmConfig | TrainingObjective, config: TrainerConfig,
                     devices: Sequence[jax.Device], rows_per_step: int, mean_tokens: int | None = None,
                     role: str = "trainer", per_sample: tuple[str, ...] = ()) -> list[Program]:
    """The update step of ``rlax train`` for a batch of ``rows_per_step`` rollouts, on ``devices``
    (packed rows: of ``mean_tokens`` tokens per rollout on average; ``Trainer.lower_step``). With
    another training objective (``rlax sft``'s, ``rlax dpo``'s) it is that job's step, ``role``;
    ``per_sample``: the batch's further arrays of one float per sample (DPO's precomputed
    ``reference_logprobs``)."""
    trainer = Trainer(model, algorithm, config, make_mesh(config.mesh, devices))
    state = trainer.abstract_state()
    # A LoRA policy's frozen base is an input of the update (and its reference policy: lower_step's default).
    base = trainer.abstract_base() if config.lora.enabled else None
    reference = state.params if trainer.objective.uses_reference and base is None else None
    return [Program(role, "update step", lambda: trainer.lower_step(state, rows_per_step, reference, base,
                                                                    mean_tokens, per_sample))]


def _replica_mesh(config: EngineConfig, devices: Sequence[jax.Device]):
    """The mesh of a replica on the first ``engine.chips_per_replica`` of ``devices`` (tensor_parallel x
    expert_parallel; None: one device)."""
    chips = config.chips_per_replica
    if len(devices) < chips:
        raise ValueError(f"engine.tensor_parallel={config.tensor_parallel} x expert_parallel={config.expert_parallel} "
                         f"needs {chips} devices of one host; the slice has {len(devices)}")
    return engine_mesh(devices[:chips], config.expert_parallel) if chips > 1 else None


def engine_params(model: ModelConfig, config: EngineConfig, dtype: str, devices: Sequence[jax.Device],
                  lora: LoraConfig | None = None) -> Any:
    """The weights an engine replica on ``devices`` (its first ``chips_per_replica``) holds, abstract
    with their shardings: the decoding layout of ``dtype`` params, and for a LoRA run (``lora``
    enabled) with an adapter version applied as the engine applies it (``Engine.update_adapters``)."""
    mesh = _replica_mesh(config, devices)
    published = lambda: init_params(model, jax.random.key(0), dtype_named(dtype))
    # As the engine holds them: an eight-bit engine's projection kernels quantized (``placement.held_weights``).
    stacked = jax.eval_shape(published if config.weight_dtype == "bfloat16"
                             else lambda: quantize_kernels(published(), config.weight_dtype))
    if mesh is None:
        params = jax.eval_shape(inference_programs.decoding_layout, stacked)
        params = _abstract(params, jax.tree.map(lambda _: SingleDeviceSharding(devices[0]), params))
    else:
        params = jax.eval_shape(unstack_layers, stacked)
        params = _abstract(params, decoding_param_shardings(model, params, mesh))
    if lora is None or not lora.enabled:
        return params
    adapters = jax.eval_shape(lambda: init_adapters(model, lora, jax.random.key(0)))  # an adapter version's tree
    return abstract_adapted_params(params, adapters, lora, lora_mode_for(config.lora_mode, devices[0].platform),
                                   model_config=model, mesh=mesh, device=devices[0])


def engine_programs(model: ModelConfig, config: EngineConfig, dtype: str, devices: Sequence[jax.Device],
                    mode: SamplingMode = SamplingMode.FILTERED, role: str = "rollout",
                    lora: LoraConfig | None = None) -> list[Program]:
    """An engine replica's prefill (each prompt bucket) and decode programs on its first
    ``chips_per_replica`` devices; decode in the most general sampling ``mode`` the role uses. ``lora``:
    a LoRA run's adapters, which the rollout engine applies to its base (``engine_params``)."""
    params = engine_params(model, config, dtype, devices, lora)
    kernels = kernels_for(config, devices[0].platform)  # as the engine picks them
    mesh = _replica_mesh(config, devices)
    place = SingleDeviceSharding(devices[0]) if mesh is None else NamedSharding(mesh, PartitionSpec())
    pools = jax.eval_shape(lambda: init_kv_cache(model.num_layers, config.num_pages, config.page_size,
                                                 model.num_kv_heads, model.head_dim, config.cache_dtype))
    cache = jax.tree.map(lambda pool: jax.ShapeDtypeStruct(pool.shape, pool.dtype, sharding=place if mesh is None
                                                           else kv_pool_sharding(pool.shape, mesh)), pools)
    host = lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=place)

    out = []
    for bucket in config.prefill_buckets:
        tokens = host(np.zeros((config.prefill_batch, bucket), np.int32))
        page_table = host(np.zeros((config.prefill_batch, config.pages_per_sequence), np.int32))
        out.append(Program(role, f"prefill {config.prefill_batch}x{bucket}", lambda tokens=tokens, page_table=page_table:
                           inference_programs.prefill.lower(params, cache, tokens, tokens, page_table,
                                                            model_config=model, mesh=mesh,
                                                            attention=kernels.prefill_attention)))
    state = {name: host(x) for name, x in SlotState(config.num_slots, config.pages_per_sequence).as_dict().items()}
    attention = kernels.decode_attention
    out.append(Program(role, f"decode {config.num_slots} slots x {config.decode_steps_per_call} steps ({attention})",
                       lambda: kernels.decode.lower(params, cache, state, model_config=model,
                                                    chunk=config.decode_steps_per_call, attention=attention, mode=mode,
                                                    mesh=mesh, interpret=False), mode, held_arrays((params, cache))))
    return out


def held_arrays(tree: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(dtype, shape on one chip) of each abstract array of ``tree``, each once (``compile.decode_step``)."""
    return tuple(dict.fromkeys((str(x.dtype), tuple(x.sharding.shard_shape(x.shape))) for x in jax.tree.leaves(tree)))
