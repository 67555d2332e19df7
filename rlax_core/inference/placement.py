"""Where an engine replica lives and what its chips run: one device or a tensor-parallel mesh, the
weights' decoding layout and the KV pool placed there, and the platform's choice of programs.

``kernels_for`` is the one place a platform picks its kernels: the engine builds its programs from
it, and ``rlax compile`` lowers the same ones for a slice it does not have (``compile.programs``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.inference import programs
from rlax_core.inference.config import EIGHT_BIT, EngineConfig
from rlax_core.inference.kv_cache import KVCache, init_kv_cache
from rlax_core.inference.pallas_attention import kernel_for_backend
from rlax_core.inference.sharding import (check_expert_parallel, decoding_param_shardings, engine_mesh,
                                          kv_pool_sharding, stacked_param_shardings)
from rlax_core.models.attention import attention_for_platform
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import quantize_kernels
from rlax_core.models.lora_config import TARGETS
from rlax_core.models.transformer import unstack_layers


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The programs one platform runs for an engine.

    prefill_attention: whole-prompt attention (``models.attention``: splash on TPU, cuDNN on GPU,
    dense on CPU). decode_attention: "tpu" / "gpu" (JAX's Pallas paged kernels, reading pages in
    place), "window" or "reference" (``EngineConfig.attention_impl``). decode: the compiled decode
    loop (the CPU's keeps a dense window). window_widths: the page-table widths decode compiles for.
    """

    prefill_attention: str
    decode_attention: str
    decode: Callable
    window_widths: tuple[int, ...]
    interpret: bool  # Pallas kernels interpreted (the CPU runs the GPU kernel so, in tests)


def kernels_for(config: EngineConfig, platform: str) -> Kernels:
    impl = config.attention_impl
    if impl == "auto":
        impl = "pallas" if platform in ("tpu", "gpu") else "window"
    # The Pallas kernel reads only the pages in use whatever the table width: one width serves. A
    # gathered window costs its width, so it comes in widths at most a quarter apart.
    widths = ((config.pages_per_sequence,) if impl == "pallas" or config.batch_invariant
              else _geometric_buckets(config.pages_per_sequence))
    return Kernels(prefill_attention=attention_for_platform(platform),
                   decode_attention=kernel_for_backend(platform) if impl == "pallas" else impl,
                   decode=programs.decode_on_cpu if platform == "cpu" else programs.decode,
                   window_widths=widths, interpret=platform == "cpu")


def lora_mode_for(mode: str, platform: str) -> str:
    """``engine.lora_mode``: "auto" is "merged", the faster on CPU as ``benchmarks/adapter_serving.py``
    measured it; TPU and GPU are not measured yet and take the same (docs/lora.md)."""
    return "merged" if mode == "auto" else mode


# Published versions quantized in this process (``held_weights``): a swap's count rises by one
# however many replicas take the version (``ReplicatedEngine`` quantizes once and hands them all the result).
QUANTIZED_VERSIONS = {"count": 0}


@functools.partial(jax.jit, static_argnames=("weight_dtype",))
def _quantize(params, *, weight_dtype: str):
    return quantize_kernels(params, weight_dtype)


def held_weights(params: Any, weight_dtype: str) -> Any:
    """``params`` as an engine with ``weight_dtype`` holds them: published weights (the stacked or
    unrolled layout) quantized per output channel (``lora.quantize_kernels``) where they lie, one
    layer's projection at a time (a stacked kernel slice by slice, into its eight-bit copy), so that
    a version given on the host is never on the chip at full width beside its quantized copy: the
    planner counts one layer's widest projection for it (``planning.memory``). Counted in
    ``QUANTIZED_VERSIONS``; full-width engines and weights already held so pass through."""
    if weight_dtype not in EIGHT_BIT or is_quantized(params):
        return params
    QUANTIZED_VERSIONS["count"] += 1
    held = dict(params)
    for layer in [name for name in params if name == "layers" or name.startswith("layers_")]:
        held[layer] = {module: dict(projections) if isinstance(projections, dict) else projections
                       for module, projections in params[layer].items()}
        for (module, proj), inputs, outputs in TARGETS.values():
            if proj not in held[layer].get(module, {}):
                continue
            leaves = params[layer][module][proj]
            one = lambda leaves: _quantize({"layers_0": {module: {proj: leaves}}},
                                           weight_dtype=weight_dtype)["layers_0"][module][proj]
            if leaves["kernel"].ndim == len(inputs) + len(outputs):  # one layer's
                held[layer][module][proj] = one(leaves)
                continue
            count = leaves["kernel"].shape[0]
            stacked = jax.tree.map(lambda piece: jnp.zeros((count, *piece.shape), piece.dtype),
                                   jax.eval_shape(one, jax.tree.map(lambda x: x[0], leaves)))
            for index in range(count):  # a host array sliced where it is: only the slice travels
                piece = jax.tree.map(lambda x, i=index: x[i] if isinstance(x, np.ndarray) else _take_layer(x, i), leaves)
                stacked = _put_layer(stacked, index, one(piece))
            held[layer][module][proj] = stacked
    return held


@jax.jit
def _take_layer(stacked, index):  # the index traced: one program per shape, not one per layer
    return stacked[index]


@functools.partial(jax.jit, donate_argnums=0)
def _put_layer(stacked, index, piece):
    return jax.tree.map(lambda whole, part: whole.at[index].set(part), stacked, piece)


def held_shapes(params: Any, weight_dtype: str) -> Any:
    """(shape, dtype) of each leaf of ``params`` as :func:`held_weights` holds them, computing nothing."""
    if weight_dtype in EIGHT_BIT and not is_quantized(params):
        params = jax.eval_shape(functools.partial(quantize_kernels, dtype=weight_dtype), params)
    return jax.tree.map(lambda x: (tuple(x.shape), x.dtype), params)


def is_quantized(params: Any) -> bool:
    """Whether ``params``' projections hold eight-bit kernels with their scales."""
    return any(getattr(path[-1], "key", None) == "kernel_scale" for path, _ in jax.tree_util.tree_leaves_with_path(params))


def _geometric_buckets(limit: int, growth: float = 1.25) -> tuple[int, ...]:
    """1, 2, 3, 4, 5, 7, 9, 12, ... up to ``limit``: a width is padded by at most a quarter."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size = max(size + 1, math.ceil(size * growth))
    return (*sizes, limit)


class Placement:
    """One replica's devices: ``device`` (default: JAX's first), or with ``config.chips_per_replica``
    N > 1 (tensor_parallel x expert_parallel) a mesh over ``devices`` (default: the first N local devices)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, device: jax.Device | None = None,
                 devices: Sequence[jax.Device] | None = None):
        check_expert_parallel(config.expert_parallel, model_config)
        self.model_config, self.weight_dtype = model_config, config.weight_dtype
        self.device, self.mesh, self._relayout = device, None, None
        chips = config.chips_per_replica
        if chips > 1:
            if device is not None:
                raise ValueError("a tensor- or expert-parallel Engine takes devices=, not one device")
            devices = list(jax.local_devices()[:chips] if devices is None else devices)
            if len(devices) != chips:
                raise ValueError(f"engine.tensor_parallel={config.tensor_parallel} x expert_parallel="
                                 f"{config.expert_parallel} needs {chips} devices; got {len(devices)}")
            self.mesh = engine_mesh(devices, config.expert_parallel)
        elif devices is not None:
            raise ValueError("devices= is for a replica of several devices (engine.tensor_parallel or "
                             "expert_parallel > 1); use device=")
        self.devices = list(self.mesh.devices.flat) if self.mesh is not None else [device or jax.devices()[0]]
        self.platform = self.devices[0].platform

    def layout(self, params: Any) -> Any:
        """The decoding layout on the replica's device(s): programs run where their committed inputs
        (weights, cache) are. Published weights are quantized first where ``weight_dtype`` says so
        (``held_weights``); weights held so already are not again."""
        params = held_weights(params, self.weight_dtype)
        if self.mesh is None:
            return programs.decoding_layout(params if self.device is None else jax.device_put(params, self.device))
        params = jax.device_put(params, stacked_param_shardings(self.model_config, params, self.mesh))
        if self._relayout is None:
            unstacked = jax.eval_shape(unstack_layers, params)
            self._relayout = programs.tensor_parallel_layout(
                decoding_param_shardings(self.model_config, unstacked, self.mesh))
        return self._relayout(params)

    def allocate_cache(self, config: EngineConfig) -> KVCache:
        """Allocated in place, on the replica's device(s): a TPU cache may not fit twice on one chip."""
        model = self.model_config
        allocate = functools.partial(init_kv_cache, model.num_layers, config.num_pages, config.page_size,
                                     model.num_kv_heads, model.head_dim, config.cache_dtype)
        if self.mesh is None:
            with jax.default_device(self.device):
                cache = allocate()
            # Committed where it lies (no copy), as every program's output cache is: an uncommitted first
            # cache made warm_up()'s first prefill another executable, so the first real call compiled.
            return jax.tree.map(lambda x: jax.device_put(x, x.sharding), cache)
        shapes = jax.eval_shape(allocate)
        return jax.jit(allocate, out_shardings=jax.tree.map(lambda x: kv_pool_sharding(x.shape, self.mesh), shapes))()
