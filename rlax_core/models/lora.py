"""LoRA: low-rank adapters on the transformer's projections, as a pytree beside the frozen base.

For a target projection with kernel ``W`` (our layout: ``[in..., out...]``) the adapted kernel is::

    W' = W + (alpha / rank) * A @ B        A [in..., rank] (random normal), B [rank, out...] (zeros)

so a fresh adapter leaves the model unchanged. The adapters form a tree shaped like the parameters
they adapt, holding only the targets (``{"layers": {"attn": {"q_proj": {"lora_a", "lora_b"}}, ...}}``),
with the same stacked or unstacked layer layout. ``merge(base, adapters, config)`` returns complete
parameters that every forward of ``transformer.py`` takes unchanged, so the trainer differentiates
through it (the base is an input it never updates), the engine merges once per weight version, and the
Hugging Face exports read it.

Why by hand and not through ``qwix`` (Google's LoRA/QLoRA library, which Tunix uses): the model's public
API is pure functions over a params dict used in three layouts (stacked layers for training, unrolled
and q/k/v-fused for decoding), and every consumer (trainer, engine, weight store, exports) passes that
dict around. qwix adapts a Flax module by intercepting its calls and keeps the adapters as module
variables of one layout; adopting it would tie the adapters to the call path of one layout and rewrite
how the engine and the store hold weights. The arithmetic here is one contraction per target.

On the fly. ``with_adapters(params, adapters)`` puts each adapter's ``lora_a``/``lora_b`` beside the
kernel it adapts (``q_proj: {kernel, lora_a, lora_b}``); the transformer's forwards then compute
``x @ W + (x @ A) @ B`` in that projection (``low_rank_term``) and never form ``W'``. Such a tree
carries ``alpha / rank`` folded into B (``scaled``). The trainer takes this path when
``dropout > 0``: LoRA dropout (as PEFT's) drops the adapter's *input*, element by element, which a
merged kernel cannot express. The engine takes it when ``engine.lora_mode`` says so, in its decoding
layout (``decoding_adapters``: unrolled layers, q/k/v and gate/up fused with block-diagonal B).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from rlax_core.config import require
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora_config import TARGETS, LoraConfig

Params = dict[str, Any]

RANK_AXIS = "lora_rank"  # no partition rule names it: the rank dimension is replicated
_A_STDDEV_GAIN = 1.0  # A ~ normal(0, 1 / sqrt(in_features)): PEFT's kaiming-uniform has the same variance scale


def _dims(model: ModelConfig) -> dict[str, int]:
    return {"embed": model.hidden_size, "heads": model.num_heads, "kv_heads": model.num_kv_heads,
            "head_dim": model.head_dim, "mlp": model.intermediate_size}


def adapter_shapes(model: ModelConfig, lora: LoraConfig) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """target -> (A's shape, B's shape) of the stacked layout (leading ``layers`` axis)."""
    mlp_targets = [t for t in lora.targets if TARGETS[t][0][0] == "mlp"]
    require(model.moe is None or (model.uniform_layers and not mlp_targets), "targets",
            f"a mixture of experts takes adapters on attention only (q, k, v, o), in a model whose layers are all "
            f"sparse: its experts have no single {'/'.join(mlp_targets) or 'mlp'} projection")
    dims, layers = _dims(model), model.num_layers
    return {t: ((layers, *(dims[a] for a in TARGETS[t][1]), lora.rank), (layers, lora.rank, *(dims[a] for a in TARGETS[t][2])))
            for t in lora.targets}


def init_adapters(model: ModelConfig, lora: LoraConfig, rng: jax.Array, dtype=jnp.float32) -> Params:
    """Fresh adapters in the stacked layout: A random, B zero (the adapted model equals the base)."""
    layer: Params = {}
    for (target, (a_shape, b_shape)), key in zip(adapter_shapes(model, lora).items(),
                                                 jax.random.split(rng, len(lora.targets))):
        fan_in = math.prod(a_shape[1:-1])
        a = jax.random.normal(key, a_shape, jnp.float32) * (_A_STDDEV_GAIN / math.sqrt(fan_in))
        (module, proj) = TARGETS[target][0]
        layer.setdefault(module, {})[proj] = {"lora_a": a.astype(dtype), "lora_b": jnp.zeros(b_shape, dtype)}
    return {"layers": layer}


def adapter_logical_axes(lora: LoraConfig) -> Params:
    """The adapters' tree with logical axis names as leaves: A keeps the kernel's input axes and B its
    output axes, so both shard by the rules that shard the kernel they adapt."""
    layer: Params = {}
    for target in lora.targets:
        (module, proj), inputs, outputs = TARGETS[target]
        layer.setdefault(module, {})[proj] = {"lora_a": ("layers", *inputs, RANK_AXIS),
                                              "lora_b": ("layers", RANK_AXIS, *outputs)}
    return {"layers": layer}


def delta(lora_a: jax.Array, lora_b: jax.Array, scale: float, kernel_ndim: int) -> jax.Array:
    """scale * A @ B in float32, shaped like the kernel (any leading layer axis kept)."""
    lead = lora_a.ndim + lora_b.ndim - 2 - kernel_ndim  # 1 for stacked layers, 0 for one layer
    n_in, n_out = lora_a.ndim - 1 - lead, lora_b.ndim - 1 - lead
    letters = "abcdefgh"
    lead_s, in_s, out_s = letters[:lead], letters[lead:lead + n_in], letters[lead + n_in:lead + n_in + n_out]
    return scale * jnp.einsum(f"{lead_s}{in_s}r,{lead_s}r{out_s}->{lead_s}{in_s}{out_s}",
                              lora_a.astype(jnp.float32), lora_b.astype(jnp.float32))


def merge(base: Params, adapters: Params, lora: LoraConfig) -> Params:
    """The base with each adapted kernel replaced by W + scale * A @ B (in W's dtype).

    ``base`` and ``adapters`` must share the layer layout (both stacked, or both unstacked). Only
    the adapted kernels are new arrays; every other leaf is the base's own.
    """
    return with_kernels(base, merged_kernels(adapted_kernels(base, adapters), adapters, lora.scale))


def adapted_kernels(base: Params, adapters: Params) -> Params:
    """The base's kernels that ``adapters`` adapt, in the adapters' tree (``{layer: {module: {proj: W}}}``)."""
    return {layer: {module: {proj: base[layer][module][proj]["kernel"] for proj in projections}
                    for module, projections in modules.items()}
            for layer, modules in adapters.items()}


def merged_kernels(kernels: Params, adapters: Params, scale: float) -> Params:
    """``adapted_kernels``' W + scale * A @ B each, in W's dtype (jit this alone: nothing else is copied).

    ``scale``: ``LoraConfig.scale``, or 1.0 for adapters that carry it already (``scaled``)."""
    return jax.tree.map(lambda w, ab: (w.astype(jnp.float32) + delta(ab["lora_a"], ab["lora_b"], scale, w.ndim)
                                       ).astype(w.dtype),
                        kernels, adapters, is_leaf=_is_adapter)


def _is_adapter(node) -> bool:
    return isinstance(node, Mapping) and "lora_a" in node


def with_kernels(base: Params, kernels: Params) -> Params:
    """``base`` with the kernels of ``kernels`` (``adapted_kernels``' tree) in place of its own."""
    return _update_projections(base, kernels, lambda kernel: {"kernel": kernel})


def _update_projections(params: Params, updates: Params, leaves_of) -> Params:
    """``params`` with ``leaves_of(update)`` added to each projection ``updates`` names (layer ->
    module -> projection); only the dicts on the way are new, no array is copied."""
    out = dict(params)
    for layer, modules in updates.items():
        out[layer] = dict(params[layer])
        for module, projections in modules.items():
            out[layer][module] = dict(params[layer][module])
            for proj, update in projections.items():
                out[layer][module][proj] = {**params[layer][module][proj], **leaves_of(update)}
    return out


def count_adapter_parameters(model: ModelConfig, lora: LoraConfig) -> int:
    return sum(math.prod(a) + math.prod(b) for a, b in adapter_shapes(model, lora).values())


# ----------------------------------------------------------------------------- on the fly


def scaled(adapters: Params, lora: LoraConfig) -> Params:
    """The adapters in float32 with ``alpha / rank`` folded into B: what ``with_adapters`` trees carry."""
    return jax.tree.map(lambda ab: {"lora_a": ab["lora_a"].astype(jnp.float32),
                                    "lora_b": lora.scale * ab["lora_b"].astype(jnp.float32)},
                        adapters, is_leaf=_is_adapter)


def with_adapters(params: Params, adapters: Params) -> Params:
    """``params`` with each adapted projection holding its adapter's leaves beside its kernel.

    Works on any tree shaped like the parameters: params (then the adapters should be ``scaled``),
    their logical axes (with ``adapter_logical_axes``), shardings. Nothing is copied.
    """
    return _update_projections(params, adapters, dict)


def low_rank_term(x: jax.Array, lora_a: jax.Array, lora_b: jax.Array) -> jax.Array:
    """(x @ A) @ B in float32: A ``[in..., rank]`` contracts x's trailing input axes, B ``[rank, out...]``."""
    hidden = jnp.tensordot(x.astype(jnp.float32), lora_a.astype(jnp.float32), axes=lora_a.ndim - 1)
    return jnp.tensordot(hidden, lora_b.astype(jnp.float32), axes=1)


# The fused projections (``transformer.fuse_projections``: the engine's layout, and the trainer's step on
# CPU): the parts, in concatenation order, with the config field giving each part's width, and the
# output axis they are joined along, counted from the end: the same for kernels, biases and B.
FUSED_PROJECTIONS = {("attn", "qkv_proj"): ((("q_proj", "num_heads"), ("k_proj", "num_kv_heads"), ("v_proj", "num_kv_heads")), -2),
          ("mlp", "gate_up_proj"): ((("gate_proj", "intermediate_size"), ("up_proj", "intermediate_size")), -1)}


def decoding_adapters(adapters: Params, model: ModelConfig, lora: LoraConfig, *, fuse: bool) -> Params:
    """Stacked adapters in the engine's decoding layout, ``scaled``: one ``layers_i`` per layer, and
    with ``fuse`` the adapters of q/k/v (gate/up) joined like their kernels: A's ranks concatenated
    and B block-diagonal, so that ``(x @ A) @ B`` is the fused kernel's delta (a part that is not
    adapted has zero blocks). The rank grows to 3 r (2 r), a cost of the same order as r per part.
    """
    layer = scaled(adapters, lora)["layers"]
    if fuse:
        layer = {module: dict(projections) for module, projections in layer.items()}
        for (module, fused_name), (parts, axis) in FUSED_PROJECTIONS.items():
            present = [name for name, _ in parts if name in layer.get(module, {})]
            if not present:
                continue
            pieces = {name: layer[module].pop(name) for name in present}
            some_b = pieces[present[0]]["lora_b"]
            width = lambda field: getattr(model, field)
            blocks = []
            for name in present:  # one row block of B per adapted part: its B in its columns, zeros elsewhere
                columns = []
                for part, field in parts:
                    if part == name:
                        columns.append(pieces[name]["lora_b"])
                    else:
                        shape = list(some_b.shape)
                        shape[axis] = width(field)
                        columns.append(jnp.zeros(shape, jnp.float32))
                blocks.append(jnp.concatenate(columns, axis=axis))
            layer[module][fused_name] = {"lora_a": jnp.concatenate([pieces[n]["lora_a"] for n in present], axis=-1),
                                         "lora_b": jnp.concatenate(blocks, axis=1)}
    count = jax.tree.leaves(layer)[0].shape[0]
    return {f"layers_{i}": jax.tree.map(lambda leaf, i=i: leaf[i], layer) for i in range(count)}


# ----------------------------------------------------------------------------- QLoRA: an int8 base


# The eight-bit kernel formats: the stored dtype and the largest magnitude it holds (the scale maps a
# channel's absmax onto it). float8_e4m3fn: 3 mantissa bits, finite up to 448, no infinities.
EIGHT_BIT_FORMATS = {"int8": (jnp.int8, 127.0), "fp8": (jnp.float8_e4m3fn, 448.0)}


def quantize_kernels(params: Params, dtype: str = "int8") -> Params:
    """Every projection kernel of ``params`` (stacked or unstacked layers; all seven, adapted or not;
    a sparse layer's experts are left as they are) as an eight-bit ``kernel`` (``dtype``: "int8" or
    "fp8", ``EIGHT_BIT_FORMATS``) with a float32 ``kernel_scale`` per output channel: absmax over the
    kernel's input axes / the format's largest value, so W ~= kernel * kernel_scale to half an int8
    step (fp8: 2^-4 relative) per channel. The forwards of ``transformer.py`` take such params
    (``projections.scaled_product``); other leaves are unchanged."""
    stored, largest = EIGHT_BIT_FORMATS[dtype]

    def quantize(leaves, lead, n_in):
        kernel = leaves["kernel"].astype(jnp.float32)
        axes = tuple(range(lead, lead + n_in))
        scale = jnp.maximum(jnp.max(jnp.abs(kernel), axis=axes), 1e-30) / largest
        quantized = jnp.clip(kernel / jnp.expand_dims(scale, axes), -largest, largest)
        if dtype == "int8":
            quantized = jnp.round(quantized)
        return {**leaves, "kernel": quantized.astype(stored), "kernel_scale": scale}
    return _map_projections(params, quantize)


def dequantize_kernels(params: Params, dtype=jnp.float32) -> Params:
    """The float params a :func:`quantize_kernels` tree stands for (kernel * scale, in ``dtype``)."""
    def dequantize(leaves, lead, n_in):
        if "kernel_scale" not in leaves:
            return leaves
        scale = jnp.expand_dims(leaves["kernel_scale"], tuple(range(lead, lead + n_in)))
        rest = {name: leaf for name, leaf in leaves.items() if name != "kernel_scale"}
        return {**rest, "kernel": (leaves["kernel"].astype(jnp.float32) * scale).astype(dtype)}
    return _map_projections(params, dequantize)


def quantized_logical_axes(axes: Params) -> Params:
    """``param_logical_axes`` for a :func:`quantize_kernels` tree: a scale has its kernel's output
    axes (after the ``layers`` axis where stacked)."""
    def add_scale(leaves, lead, n_in):
        names = leaves["kernel"]
        return {**leaves, "kernel_scale": (*names[:lead], *names[lead + n_in:])}
    return _map_projections(axes, add_scale, lead_of=lambda leaves: int(leaves["kernel"][0] == "layers"))


def _map_projections(tree: Params, fn, lead_of=None) -> Params:
    """``tree`` with each projection's dict replaced by ``fn(leaves, lead, n_in)``: ``lead`` leading
    layer axes (1 stacked, 0 unstacked), ``n_in`` input axes of its kernel."""
    out = dict(tree)
    for layer in [name for name in tree if name == "layers" or name.startswith("layers_")]:
        out[layer] = {module: dict(projections) for module, projections in tree[layer].items()}
        for (module, proj), inputs, outputs in TARGETS.values():
            if proj not in out[layer].get(module, {}):
                continue  # a sparse layer (its experts are not these projections)
            leaves = out[layer][module][proj]
            lead = lead_of(leaves) if lead_of else leaves["kernel"].ndim - len(inputs) - len(outputs)
            out[layer][module][proj] = fn(leaves, lead, len(inputs))
    return out
