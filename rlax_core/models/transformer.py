"""A decoder-only transformer for Llama 2/3, Qwen2/2.5, Qwen3 and their mixtures of experts (Qwen2-MoE,
Qwen3-MoE), in Flax linen. Read top to bottom.

    tokens -> embedding
           -> num_layers x [ x + Attention(RMSNorm(x)) ; x + FeedForward(RMSNorm(x)) ]   (one scanned Block)
           -> RMSNorm -> classifier (the embedding itself when tied) -> float32 logits

The feed-forward is a SwiGLU MLP, or in a sparse layer of a mixture of experts the ``SparseMoe`` of
``moe.py`` (a top-k router over stacked experts), which also reports what it routed (``Routing``).

Attention is grouped-query (num_kv_heads <= num_heads) with rotary positions (RoPE), optional q/k/v
biases (Qwen2) and optional RMSNorm on q and k (Qwen3). The layers are one ``Block`` scanned
``num_layers`` times, so every per-layer weight carries a leading ``layers`` axis and the compile
time does not grow with depth. A model mixing dense and sparse layers (Qwen3-MoE's ``mlp_only_layers``,
``decoder_sparse_step`` > 1) cannot be one scan: its layers are unrolled, ``layers_0 .. layers_{n-1}``.

Functional API (parameters are a plain nested dict; ``config`` is hashable, pass it as a static arg)::

    params = init_params(config, jax.random.key(0), dtype=jnp.bfloat16)
    axes   = param_logical_axes(config)    # same tree; leaves are tuples such as ("layers", "embed", "mlp")
    logits = forward(params, config, input_ids, attention_mask=mask)           # float32 [B, S, V]
    hidden = hidden_states(params, config, input_ids, attention_mask=mask)     # [B, S, hidden]: for value heads
    logits, routing = forward_with_routing(params, config, input_ids, attention_mask=mask)  # MoE: what it routed
    logits = forward(params, config, input_ids, attention_mask=mask, expert_ids=routing.expert_ids)  # router replay
    logits, cache = forward_with_cache(params, config, input_ids, positions, cache, attend)
    decoding = fuse_projections(unstack_layers(params))  # the rollout engine's layout; both forwards take it

Pluggable attention (how the rollout engine brings its own paged KV cache and kernels)::

    attend(layer, q, k, v, cache) -> (out, cache)

      layer   the layer index: a traced int32 under the scan, a Python int with unstacked layers
      q       [B, T, num_heads, head_dim]     after q/k RMSNorm (Qwen3) and RoPE, compute dtype
      k, v    [B, T, num_kv_heads, head_dim]  the new tokens' keys and values, after norm and RoPE
      cache   the pytree given to ``forward_with_cache``, all layers at once, returned updated
      out     [B, T, num_heads, head_dim]

    ``positions`` [B, T] int32 are absolute token positions; a negative position marks a padding
    slot that the default cache neither stores nor lets anyone attend to.

``contiguous_attend(positions)`` with ``init_cache`` is the default: a dense ``[layers, B, max_len,
kv_heads, head_dim]`` cache in which slot s holds position s. It serves ``greedy_generate`` and is
the reference any faster attend must match. An attend needing more per-step data (page tables,
slot ids) closes over it the same way ``contiguous_attend`` closes over ``positions``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from rlax_core.models.attention import AttentionImpl, causal_attention, masked_attention, same_segment_mask
from rlax_core.models.context import balanced_order, context_attention, context_shards, shard_tokens
from rlax_core.models.config import INIT_STDDEV, ModelConfig, rope_inverse_frequencies
from rlax_core.models.layouts import (fuse_projections, layout_flags, stack_layers, unfuse_projections,  # noqa: F401
                                      unstack_layers)  # the layouts are re-exported: callers import them from here
from rlax_core.models.moe import Routing, SparseMoe
from rlax_core.models.projections import LORA_DROPOUT_RNG, project

Params = dict[str, Any]
Attend = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]

def _logical(init, *axes: str):
    return nn.with_logical_partitioning(init, axes)


# ----------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    """x / rms(x) * scale, computed in float32 (a bfloat16 mean of squares loses the small entries)."""

    eps: float
    axis_name: str = "embed"
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", _logical(nn.initializers.ones, self.axis_name), (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        # Hugging Face casts back to the input dtype before scaling; so do we, to match bf16 runs.
        return scale.astype(x.dtype) * normed.astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, config: ModelConfig) -> jax.Array:
    """Rotate each (pair of) channel(s) of x [B, T, H, D] by position * frequency, in float32.

    Hugging Face pairs channel i with i + D/2 ("half-split"); llama2.c pairs 2i with 2i + 1
    ("interleaved"). They are the same rotation up to a permutation of the q/k projection rows.
    """
    inv_freq = jnp.asarray(rope_inverse_frequencies(config), jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    if config.rope_interleaved:
        even, odd = x32[..., 0::2], x32[..., 1::2]
        rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(x.shape)
    else:
        first, second = jnp.split(x32, 2, axis=-1)
        rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


class Attention(nn.Module):
    config: ModelConfig
    attend: Attend
    param_dtype: Any = jnp.float32
    fused_projections: bool = False  # one qkv_proj instead of q_proj, k_proj, v_proj (fuse_projections)
    lora_dropout: float = 0.0

    @nn.compact
    def __call__(self, x, positions, layer, cache):
        c = self.config

        def heads(name, num_heads, heads_axis):
            return project(self, name, x, lambda: nn.DenseGeneral(
                (num_heads, c.head_dim), use_bias=c.qkv_bias, param_dtype=self.param_dtype, name=name,
                kernel_init=_logical(nn.initializers.normal(INIT_STDDEV), "embed", heads_axis, "head_dim"),
                bias_init=_logical(nn.initializers.zeros, heads_axis, "head_dim")), input_axes=1,
                dropout=self.lora_dropout)

        if self.fused_projections:
            qkv = heads("qkv_proj", c.num_heads + 2 * c.num_kv_heads, "heads")
            q, k, v = jnp.split(qkv, [c.num_heads, c.num_heads + c.num_kv_heads], axis=-2)
        else:
            q = heads("q_proj", c.num_heads, "heads")
            # Separate name: fewer KV heads may not divide the mesh axis that q heads shard over.
            k = heads("k_proj", c.num_kv_heads, "kv_heads")
            v = heads("v_proj", c.num_kv_heads, "kv_heads")
        if c.qk_norm:
            q = RMSNorm(c.rms_norm_eps, "head_dim", self.param_dtype, name="q_norm")(q)
            k = RMSNorm(c.rms_norm_eps, "head_dim", self.param_dtype, name="k_norm")(k)
        q, k = apply_rope(q, positions, c), apply_rope(k, positions, c)
        out, cache = self.attend(layer, q, k, v, cache)
        projected = project(self, "o_proj", out, lambda: nn.DenseGeneral(
            c.hidden_size, axis=(-2, -1), use_bias=False, param_dtype=self.param_dtype, name="o_proj",
            kernel_init=_logical(nn.initializers.normal(INIT_STDDEV), "heads", "head_dim", "embed")),
            input_axes=2, dropout=self.lora_dropout)
        return projected, cache


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    config: ModelConfig
    param_dtype: Any = jnp.float32
    fused_projections: bool = False  # one gate_up_proj instead of gate_proj and up_proj (fuse_projections)
    lora_dropout: float = 0.0

    @nn.compact
    def __call__(self, x):
        def dense(name, features, axes, inputs):
            return project(self, name, inputs, lambda: nn.Dense(
                features, use_bias=False, param_dtype=self.param_dtype, name=name,
                kernel_init=_logical(nn.initializers.normal(INIT_STDDEV), *axes)), input_axes=1, dropout=self.lora_dropout)

        hidden = self.config.intermediate_size
        if self.fused_projections:
            gate, up = jnp.split(dense("gate_up_proj", 2 * hidden, ("embed", "mlp"), x), 2, axis=-1)
        else:
            gate = dense("gate_proj", hidden, ("embed", "mlp"), x)
            up = dense("up_proj", hidden, ("embed", "mlp"), x)
        return dense("down_proj", self.config.hidden_size, ("mlp", "embed"), nn.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm layer. Its signature is a scan body: (carry, layer, ...) -> (carry, Routing or None)."""

    config: ModelConfig
    attend: Attend
    param_dtype: Any = jnp.float32
    fused_projections: bool = False
    lora_dropout: float = 0.0
    sparse: bool = False  # the feed-forward is the mixture of experts (config.is_moe_layer)
    mesh: Any = None  # the experts' mesh (moe.expert_parallel); None: one device's arrays

    @nn.compact
    def __call__(self, carry, layer, positions, real, expert_ids):
        x, cache = carry
        c = self.config
        attention_in = RMSNorm(c.rms_norm_eps, "embed", self.param_dtype, name="input_norm")(x)
        attention_out, cache = Attention(c, self.attend, self.param_dtype, self.fused_projections, self.lora_dropout, name="attn")(
            attention_in, positions, layer, cache)
        x = x + attention_out
        mlp_in = RMSNorm(c.rms_norm_eps, "embed", self.param_dtype, name="post_attention_norm")(x)
        if self.sparse:
            mlp_out, routing = SparseMoe(c, self.param_dtype, self.mesh, name="moe")(mlp_in, real, expert_ids)
        else:
            mlp_out, routing = SwiGLU(c, self.param_dtype, self.fused_projections, self.lora_dropout, name="mlp")(mlp_in), None
        return (x + mlp_out, cache), routing


class Transformer(nn.Module):
    config: ModelConfig
    attend: Attend
    param_dtype: Any = jnp.float32
    remat: bool = False  # recompute each layer's activations in the backward pass (saves memory)
    scan_layers: bool = True  # False: layers_0 .. layers_{n-1} with their own weights (see unstack_layers)
    fused_projections: bool = False  # qkv_proj and gate_up_proj (see fuse_projections)
    lora_dropout: float = 0.0  # LoRA dropout rate: applied when the apply has a LORA_DROPOUT_RNG rng
    mesh: Any = None  # the mesh a mixture of experts splits its experts over

    @nn.compact
    def __call__(self, input_ids, positions, cache, last_token_only: bool = False, hidden_only: bool = False,
                 real=None, expert_ids=None):
        """-> (logits or hidden states, cache, Routing stacked over the sparse layers or None).

        ``real`` [B, T] marks the tokens the router's summaries count (default: all); ``expert_ids``
        [moe_layers, B, T, k] replays those experts instead of each router's top k.
        """
        c = self.config
        embed = nn.Embed(c.vocab_size, c.hidden_size, param_dtype=self.param_dtype, name="embed_tokens",
                         embedding_init=_logical(nn.initializers.normal(INIT_STDDEV), "vocab", "embed"))
        x = embed(input_ids)  # in the parameter dtype: that is the compute dtype
        if real is None:
            real = jnp.ones(input_ids.shape, bool)
        if expert_ids is not None and expert_ids.shape[:1] != (len(c.moe_layers),):
            raise ValueError(f"expert_ids: shape {tuple(expert_ids.shape)}, expected [moe_layers={len(c.moe_layers)}, "
                             f"batch, tokens, experts_per_token]")

        block = nn.remat(Block, prevent_cse=False) if self.remat else Block
        settings = (c, self.attend, self.param_dtype, self.fused_projections, self.lora_dropout)
        if self.scan_layers:
            # One body for every layer, so they are all dense or all sparse.
            if not c.uniform_layers:
                raise ValueError("stacked layers of a model mixing dense and sparse layers: its params are unrolled "
                                 "(init_params and from_pretrained give them so)")
            layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True, LORA_DROPOUT_RNG: True},
                             in_axes=(0, nn.broadcast, nn.broadcast, 0), length=c.num_layers,
                             metadata_params={nn.PARTITION_NAME: "layers"})
            (x, cache), routing = layers(*settings, c.is_moe_layer(0), self.mesh, name="layers")(
                (x, cache), jnp.arange(c.num_layers, dtype=jnp.int32), positions, real, expert_ids)
        else:
            routings = []
            for layer in range(c.num_layers):  # a Python int: attends may index per-layer state statically
                sparse = c.is_moe_layer(layer)
                replayed = expert_ids[len(routings)] if sparse and expert_ids is not None else None
                (x, cache), routed = block(*settings, sparse, self.mesh, name=f"layers_{layer}")(
                    (x, cache), layer, positions, real, replayed)
                routings += [routed] if sparse else []
            routing = jax.tree.map(lambda *layers: jnp.stack(layers), *routings) if routings else None

        x = RMSNorm(c.rms_norm_eps, "embed", self.param_dtype, name="norm")(x)
        if last_token_only:
            x = x[:, -1:]
        if hidden_only:  # what a value (or reward) head reads; no classifier, so no lm_head parameter either
            return x, cache, routing
        # The classifier runs in float32 whatever the parameter dtype: log-probs feed the RL loss.
        if c.tie_word_embeddings:
            classifier = embed.embedding.T
        else:
            classifier = self.param("lm_head", _logical(nn.initializers.normal(INIT_STDDEV), "embed", "vocab"),
                                    (c.hidden_size, c.vocab_size), self.param_dtype)
        logits = jnp.einsum("bte,ev->btv", x.astype(jnp.float32), classifier.astype(jnp.float32))
        return logits, cache, routing


# ----------------------------------------------------------------------------- functional API


def _full_sequence_attend(mask: jax.Array) -> Attend:
    def attend(layer, q, k, v, cache):
        return masked_attention(q, k, v, mask), cache

    return attend


def _context_attend(segment_ids: jax.Array, token_index: jax.Array, mesh, impl: AttentionImpl) -> Attend:
    def attend(layer, q, k, v, cache):
        return context_attention(q, k, v, segment_ids, token_index, mesh, impl), cache

    return attend


def _kernel_attend(segment_ids: jax.Array, impl: AttentionImpl, mesh) -> Attend:
    def attend(layer, q, k, v, cache):
        return causal_attention(q, k, v, segment_ids, impl=impl, mesh=mesh), cache

    return attend


def init_params(config: ModelConfig, rng: jax.Array, dtype=jnp.float32) -> Params:
    """Random parameters (normal(0.02) matrices, unit norms, zero biases) as a plain nested dict: the
    layers stacked, or unrolled when dense and sparse layers mix (``config.uniform_layers``)."""
    return nn.unbox(_init_variables(config, rng, dtype)["params"])


def _init_variables(config: ModelConfig, rng: jax.Array, dtype):
    ids = jnp.zeros((1, 1), jnp.int32)
    model = Transformer(config, _full_sequence_attend(jnp.ones((1, 1, 1), bool)), dtype,
                        scan_layers=config.uniform_layers)
    return jax.jit(model.init)(rng, ids, ids, None)


@functools.lru_cache(maxsize=64)
def _abstract_variables(config: ModelConfig):
    """The float32 variables' shapes and partitioning of ``config``'s model, traced once per config:
    the planner asks for them for every role of every recipe (a trace costs a quarter second)."""
    return jax.eval_shape(lambda: _init_variables(config, jax.random.key(0), jnp.float32))


def param_shapes(config: ModelConfig) -> Params:
    """``init_params(config, ...)``'s tree as shapes and dtypes (float32), without making it."""
    return nn.unbox(_abstract_variables(config)["params"])


def param_logical_axes(config: ModelConfig) -> Params:
    """The params tree with tuples of logical axis names as leaves (use ``is_leaf=lambda x: isinstance(x, tuple)``).

    Names: vocab, embed, heads (query heads), kv_heads, head_dim, mlp, layers; a mixture of experts
    adds expert (the stacked experts) and router (the router's scores).
    """
    specs = nn.get_partition_spec(_abstract_variables(config))["params"]
    return jax.tree.map(tuple, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """0, 1, 2, ... over the real tokens of each row, whichever side the padding is on."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(params: Params, config: ModelConfig, input_ids: jax.Array, *, positions: jax.Array | None = None,
            attention_mask: jax.Array | None = None, remat: bool = False, attention: AttentionImpl = "dense",
            mesh=None, lora_dropout: float = 0.0, lora_dropout_rng: jax.Array | None = None,
            expert_ids: jax.Array | None = None, segment_ids: jax.Array | None = None) -> jax.Array:
    """Full-sequence forward for training and scoring: float32 logits [B, S, V].

    Token i sees tokens j <= i whose ``attention_mask`` is 1. ``positions`` default to the count of
    real tokens before each one, which is right for left and right padding alike. ``params`` may be
    stacked (scanned layers) or ``unstack_layers``'d (unrolled layers: no per-layer weight slices or
    stacked activations; faster for shallow models on CPU, but the compile time grows with depth).
    ``attention``: the implementation (``models.attention``: dense XLA, or the TPU's splash kernel
    or cuDNN's, which leave a padding position's output unspecified); ``mesh``: the one the
    operands are sharded over, for a kernel XLA cannot partition (and a mixture of experts' experts,
    split over its ``expert`` axis). ``params`` holding adapters beside
    their kernels (``lora.with_adapters``) run them on the fly; ``lora_dropout`` drops their inputs
    at that rate, with masks drawn from ``lora_dropout_rng`` (none given: no dropout).
    ``expert_ids`` [moe_layers, B, S, k] (a mixture of experts): run those experts instead of each
    router's top k, weighted by the router's probabilities of them (router replay).
    ``segment_ids`` [B, S] int32 (packed rows: 1, 2, ... per sequence, 0 padding) replace
    ``attention_mask``: token i sees tokens j <= i of its own segment only; give each segment's
    ``positions`` too (they restart at 0 in each).
    """
    logits, _ = _full_sequence(params, config, input_ids, positions=positions, attention_mask=attention_mask,
                               remat=remat, attention=attention, mesh=mesh, lora_dropout=lora_dropout,
                               lora_dropout_rng=lora_dropout_rng, expert_ids=expert_ids, segment_ids=segment_ids)
    return logits


def forward_with_routing(params: Params, config: ModelConfig, input_ids: jax.Array, **options) -> tuple[jax.Array, Routing]:
    """As :func:`forward` (same options), and the ``Routing`` of a mixture of experts: the expert ids
    [moe_layers, B, S, k] each token ran (small unsigned integers) and the router's summaries over the
    tokens ``attention_mask`` marks real, for ``moe.load_balancing_loss`` and ``moe.router_z_loss``."""
    if config.moe is None:
        raise ValueError("forward_with_routing: this model has no mixture of experts (config.moe is None)")
    return _full_sequence(params, config, input_ids, **options)


def hidden_states(params: Params, config: ModelConfig, input_ids: jax.Array, *, positions: jax.Array | None = None,
                  attention_mask: jax.Array | None = None, remat: bool = False, attention: AttentionImpl = "dense",
                  mesh=None, segment_ids: jax.Array | None = None) -> jax.Array:
    """As :func:`forward`, but the last layer's normalised hidden states [B, S, hidden] (compute dtype)
    instead of logits: the input of a value or reward head. ``params`` need no ``lm_head``."""
    hidden, _ = _full_sequence(params, config, input_ids, positions=positions, attention_mask=attention_mask,
                               remat=remat, attention=attention, mesh=mesh, hidden_only=True, segment_ids=segment_ids)
    return hidden


def _full_sequence(params, config, input_ids, *, positions=None, attention_mask=None, remat=False, attention="dense",
                   mesh=None, hidden_only=False, lora_dropout=0.0, lora_dropout_rng=None, expert_ids=None,
                   segment_ids=None):
    batch, steps = input_ids.shape
    if segment_ids is not None:  # packed rows: the segments are the mask
        attention_mask = segment_ids > 0
    elif attention_mask is None:
        attention_mask = jnp.ones((batch, steps), jnp.int32)
    if positions is None:
        positions = default_positions(attention_mask)
    context = context_shards(mesh)
    if context > 1:  # context parallelism (models.context): the row's tokens over the context axis
        if config.moe is not None:
            raise ValueError("context parallelism (trainer.mesh.context > 1) does not yet run a mixture of experts")
        order = balanced_order(steps, context)
        segments = attention_mask.astype(jnp.int32) if segment_ids is None else segment_ids
        input_ids, positions, attention_mask, segments = (shard_tokens(x[:, order], mesh) for x in
                                                          (input_ids, positions, attention_mask, segments))
        token_index = jnp.asarray(order, jnp.int32)
        attend = _context_attend(segments, token_index, mesh, attention)
    elif attention == "dense" and segment_ids is not None:
        attend = _full_sequence_attend(same_segment_mask(segment_ids))
    elif attention == "dense":
        causal = jnp.tril(jnp.ones((steps, steps), bool))
        attend = _full_sequence_attend(causal[None] & attention_mask.astype(bool)[:, None, :])
    else:  # a padded row's real tokens form segment 1, its padding segment 0
        attend = _kernel_attend(attention_mask.astype(jnp.int32) if segment_ids is None else segment_ids,
                                attention, mesh)
    dtype = params["embed_tokens"]["embedding"].dtype
    model = Transformer(config, attend, dtype, remat=remat, lora_dropout=lora_dropout, mesh=mesh, **layout_flags(params))
    rngs = {} if lora_dropout_rng is None else {LORA_DROPOUT_RNG: lora_dropout_rng}
    out, _, routing = model.apply({"params": params}, input_ids, positions, None, hidden_only=hidden_only,
                                  real=attention_mask.astype(bool), expert_ids=expert_ids, rngs=rngs)
    if context > 1:
        out = out[:, np.argsort(order)]
    return out, routing


def forward_with_cache(params: Params, config: ModelConfig, input_ids: jax.Array, positions: jax.Array, cache: Any,
                       attend: Attend | None = None, *, last_token_only: bool = False, expert_ids=None,
                       with_routing: bool = False, mesh=None):
    """Forward T new tokens [B, T] at ``positions`` [B, T] against a KV cache; returns (logits, cache).

    ``attend`` defaults to ``contiguous_attend(positions)`` (``cache`` from ``init_cache``). With
    ``last_token_only`` the logits are [B, 1, V] for the last column (a prefill needs no more).
    A mixture of experts: ``with_routing`` returns (logits, cache, Routing) too, for the new tokens
    (padding slots, negative positions, not counted in its summaries); ``expert_ids`` as in ``forward``;
    ``mesh``: the one its experts are split over (``moe.expert_parallel``; an engine replica's mesh).
    """
    dtype = params["embed_tokens"]["embedding"].dtype
    model = Transformer(config, attend or contiguous_attend(positions), dtype, mesh=mesh, **layout_flags(params))
    logits, cache, routing = model.apply({"params": params}, input_ids, positions, cache, last_token_only,
                                         real=positions >= 0, expert_ids=expert_ids)
    return (logits, cache, routing) if with_routing else (logits, cache)


# ----------------------------------------------------------------------------- the default KV cache


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> dict[str, jax.Array]:
    """An empty contiguous cache: slot s of row b holds the key/value of position s."""
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
            "filled": jnp.zeros((batch, max_len), bool)}


def contiguous_attend(positions: jax.Array) -> Attend:
    """The default attend for ``init_cache``'s cache, for new tokens at ``positions`` [B, T].

    Writes the new keys/values into the slots named by their positions (negative: dropped), then lets
    each query see the filled slots at or before its own position.
    """
    batch, _ = positions.shape
    rows = jnp.arange(batch)[:, None]

    def attend(layer, q, k, v, cache):
        max_len = cache["filled"].shape[1]
        slots = jnp.where(positions >= 0, positions, max_len)  # out of range: mode="drop" skips it
        filled = cache["filled"].at[rows, slots].set(True, mode="drop")
        keys = cache["k"][layer].at[rows, slots].set(k.astype(cache["k"].dtype), mode="drop")
        values = cache["v"][layer].at[rows, slots].set(v.astype(cache["v"].dtype), mode="drop")
        visible = filled[:, None, :] & (jnp.arange(max_len)[None, None, :] <= positions[:, :, None])
        out = masked_attention(q, keys.astype(q.dtype), values.astype(q.dtype), visible)
        cache = {"k": cache["k"].at[layer].set(keys), "v": cache["v"].at[layer].set(values), "filled": filled}
        return out, cache

    return attend
