"""The layouts of the transformer's parameters: layers stacked (``layers``, the scan's) or unrolled
(``layers_0 .. layers_{n-1}``, the engine's), projections apart or fused (``qkv_proj``, ``gate_up_proj``).
Every forward of ``transformer.py`` takes each of them (``layout_flags``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import FUSED_PROJECTIONS

Params = dict[str, Any]


def unstack_layers(params: Params) -> Params:
    """The stacked ``layers`` weights split into ``layers_0 .. layers_{n-1}``: the decoding layout.

    ``forward_with_cache`` accepts either layout and runs this one as an unrolled loop. A decode
    step is dominated by reading the weights; unrolled layers read each one in place, where the
    scan's per-iteration slice of the stacked weights costs a copy (about a fifth of the step on
    CPU). ``forward`` accepts it too; training keeps the stacked layout unless the trainer's
    ``scan_layers`` is off (the compile time of a scan does not grow with depth). Params already
    unrolled (a model mixing dense and sparse layers is stored so) come back as they are.
    """
    if "layers" not in params:
        return params
    stacked = params["layers"]
    count = jax.tree.leaves(stacked)[0].shape[0]
    rest = {name: value for name, value in params.items() if name != "layers"}
    return {**rest, **{f"layers_{i}": jax.tree.map(lambda leaf, i=i: leaf[i], stacked) for i in range(count)}}


def fuse_projections(params: Params) -> Params:
    """Each layer's q/k/v weights concatenated into ``attn/qkv_proj`` (along the heads axis) and its
    gate/up kernels into ``mlp/gate_up_proj``: the decoding layout, with stacked or unstacked layers.

    Both forwards accept it. It computes the same numbers with three fewer matrix products per
    layer, which matters when a decode step multiplies one token per sequence: there a product's
    fixed cost outweighs its arithmetic. The trainer fuses them inside its step only where every
    device holds whole weights (``trainer.projections``): q and k/v heads may shard differently.
    A sparse layer's experts stay as they are (it has no ``mlp``).
    """
    def fuse(layer):
        layer = dict(layer)
        for (block, fused), (parts, axis) in FUSED_PROJECTIONS.items():
            if block not in layer:
                continue
            modules = dict(layer[block])
            pieces = [modules.pop(name) for name, _ in parts]
            if any("lora_a" in piece for piece in pieces):
                raise ValueError("fuse_projections: these params hold adapters; fuse the base, then add "
                                 "lora.decoding_adapters(..., fuse=True)")
            modules[fused] = {leaf: jnp.concatenate([piece[leaf] for piece in pieces], axis=axis) for leaf in pieces[0]}
            layer[block] = modules
        return layer

    return _per_layer(fuse, params)


def unfuse_projections(params: Params, config: ModelConfig) -> Params:
    """The inverse of :func:`fuse_projections`: ``qkv_proj`` split into q/k/v along the heads axis and
    ``gate_up_proj`` into gate and up (for example gradients taken in the fused layout)."""
    def split(layer):
        layer = dict(layer)
        for (block, fused), (parts, axis) in FUSED_PROJECTIONS.items():
            if block not in layer:
                continue
            modules = dict(layer[block])
            joined = modules.pop(fused)
            ends = np.cumsum([getattr(config, width) for _, width in parts])[:-1]
            for leaf, value in joined.items():
                for (name, _), piece in zip(parts, jnp.split(value, ends, axis=axis)):
                    modules.setdefault(name, {})[leaf] = piece
            layer[block] = modules
        return layer

    return _per_layer(split, params)


def _per_layer(convert: Callable[[Params], Params], params: Params) -> Params:
    """``convert`` applied to each layer's weights, stacked (``layers``) or not (``layers_i``)."""
    return {name: convert(value) if name == "layers" or name.startswith("layers_") else value
            for name, value in params.items()}


def layout_flags(params: Params) -> dict[str, bool]:
    """The Transformer flags that read ``params`` as given: stacked or not, projections fused or not."""
    layer = params["layers"] if "layers" in params else params["layers_0"]
    return {"scan_layers": "layers" in params, "fused_projections": "qkv_proj" in layer["attn"]}


def stack_layers(params: Params) -> Params:
    """The inverse of :func:`unstack_layers`: ``layers_0 .. layers_{n-1}`` stacked into ``layers``
    (for example gradients taken in the unrolled layout, going back to the stacked one). Layers whose
    weights differ (dense and sparse mixed) cannot stack: they come back unrolled, their stored layout."""
    count = sum(name.startswith("layers_") for name in params)
    structures = {jax.tree.structure(params[f"layers_{i}"]) for i in range(count)}
    if len(structures) > 1:
        return params
    rest = {name: value for name, value in params.items() if not name.startswith("layers_")}
    return {**rest, "layers": jax.tree.map(lambda *leaves: jnp.stack(leaves), *(params[f"layers_{i}"] for i in range(count)))}
