"""The engine's compiled programs: prefill, page copy, the decode loop, and the weights' relayout.

Each is jitted once per static shape and donates the KV cache, which it returns updated. The
host side (``engine``) decides what runs when; these decide nothing, they compute.

``mesh`` (static) is a tensor- or expert-parallel replica's mesh (``sharding``), None for one device.
The programs are the same either way: XLA partitions them from the sharded weights and cache. Only the
Pallas kernels, which XLA cannot partition, run per device under ``shard_map``, as do a mixture of
experts' experts (the model's ``moe.expert_parallel``, given the mesh), and the returned cache is
pinned to its KV-head sharding so that a donated cache keeps its placement.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rlax_core.inference.attention import paged_decode_attention_reference, prefill_attention, window_decode_attention
from rlax_core.inference.kv_cache import (DecodeWindow, KVCache, dequantize_tokens, gather_window, quantize_tokens,
                                          scatter_window, write_layer)
from rlax_core.inference.pallas_attention import paged_decode_attention
from rlax_core.inference.sharding import heads_spec, kv_heads_split, kv_pool_sharding
from rlax_core.inference.sampling import SamplingMode, sample_tokens, token_draws
from rlax_core.models.attention import AttentionImpl, causal_attention, fits
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import decoding_adapters, merged_kernels
from rlax_core.models.lora_config import LoraConfig
from rlax_core.models.transformer import forward_with_cache, fuse_projections, unstack_layers


@jax.jit
def decoding_layout(params):
    """The engine's weight layout: unrolled layers, fused projections (``models.transformer``).

    One dispatch: sliced op by op, the weights of a trainer's multi-device mesh took 44 ms per swap
    for stories260K on 2 CPU devices.
    """
    return fuse_projections(unstack_layers(params))


@functools.partial(jax.jit, static_argnames=("model_config", "lora", "fuse"))
def adapter_layout(adapters, *, model_config: ModelConfig, lora: LoraConfig, fuse: bool):
    """Stacked adapters in the decoding layout, scale folded in (``lora.decoding_adapters``)."""
    return decoding_adapters(adapters, model_config, lora, fuse=fuse)


@jax.jit
def merge_adapters(kernels, adapters):
    """The engine's merged kernels: each W + (A @ B) of decoding-layout adapters (scale folded in).
    Only the adapted kernels pass through: a leaf returned unchanged by a jit would be copied."""
    return merged_kernels(kernels, adapters, 1.0)


def tensor_parallel_layout(shardings):
    """A tensor-parallel replica's relayout program: unrolled layers, projections kept apart, each
    weight placed by ``shardings``. Build it once per engine: every weight swap runs it.

    Fused q/k/v (or gate/up) weights concatenate differently sharded heads (columns) along one
    axis, so an even split of the fusion would hand a device a mix of q and k heads; kept apart,
    each splits by its own rule.
    """
    return jax.jit(unstack_layers, out_shardings=shardings)


def pin_kv_sharding(cache: KVCache, mesh) -> KVCache:
    """A tensor-parallel replica's returned cache keeps its KV-head sharding (a donated cache its placement)."""
    if mesh is None:
        return cache
    pin = lambda pool: jax.lax.with_sharding_constraint(pool, kv_pool_sharding(pool.shape, mesh))
    return jax.tree.map(pin, cache)


@functools.partial(jax.jit, static_argnames=("model_config", "mesh", "attention"), donate_argnames=("cache",))
def prefill(params, cache: KVCache, tokens, positions, page_table, *, model_config: ModelConfig,
            mesh=None, attention: AttentionImpl = "dense"):
    """Run left-padded prompt prefixes [B, T] through the model and write their keys and values into their pages.

    ``attention``: the prompts' attention on themselves (``models.attention``): dense, or the chip's
    flash kernel, which a bucket it cannot tile (splash: not a multiple of 128 tokens) runs dense.
    Returns (cache, routed): a mixture of experts' routed expert ids [B, T, moe_layers, k] (what
    router replay needs of the prompt), None for a dense model.
    """
    valid = positions >= 0
    scale = model_config.head_dim ** -0.5
    if not fits(attention, tokens.shape[1]):
        attention = "dense"

    def attend(layer, q, k, v, cache):
        cache = write_layer(cache, layer, k, v, page_table, positions, valid)
        if attention == "dense":
            return prefill_attention(q, k, v, valid, scale), cache
        return causal_attention(q, k, v, valid.astype(jnp.int32), impl=attention, mesh=mesh), cache

    # The classifier's output is not returned: the compiler drops it.
    _, cache, *routing = forward_with_cache(params, model_config, tokens, positions, cache, attend,
                                            last_token_only=True, with_routing=model_config.moe is not None,
                                            mesh=mesh)
    return pin_kv_sharding(cache, mesh), (token_major(routing[0].expert_ids) if routing else None)


def token_major(expert_ids: jax.Array) -> jax.Array:
    """A forward's routed ids [moe_layers, B, T, k] as a record holds them: [B, T, moe_layers, k]."""
    return jnp.moveaxis(expert_ids, 0, 2)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("cache",))
def copy_pages(cache: KVCache, source, target, *, mesh=None) -> KVCache:
    """Copy pages ``source[i, j]`` to ``target[i, j]`` in every layer (both [rows, pages]; 0 -> 0 is a no-op)."""
    copy = lambda pool: pool.at[:, target].set(pool[:, source], mode="promise_in_bounds")
    return pin_kv_sharding(jax.tree.map(copy, cache), mesh)  # the scale pools of eight-bit pages with their pages


def _decode(params, cache: KVCache, state, *, model_config: ModelConfig, chunk: int, attention: str,
            mode: SamplingMode, mesh=None, interpret: bool = False):
    """Decode up to ``chunk`` tokens for every active slot; stop early when all are done.

    ``attention``: "window", "reference", or a Pallas kernel's name (``pallas_attention.KERNELS``),
    interpreted when ``interpret``. Returns tokens and log-probs [num_slots, chunk] (-1 where a slot produced nothing), the
    number of steps run, the updated slot state, a mixture of experts' routed ids [num_slots, chunk,
    moe_layers, k] (step j's: those of the token it fed, at the slot's length + j; None for a dense
    model) and the cache.
    """
    moe = model_config.moe
    num_slots = state["active"].shape[0]
    scale = model_config.head_dim ** -0.5
    page_table = state["page_table"]
    windowed = attention == "window"

    # Every row's draws for the chunk's tokens, by token: a row's j-th step makes its token generated + j.
    draws = (token_draws(state["seed"], state["prompt_key"], state["sample_index"], state["generated"], chunk)
             if mode != SamplingMode.GREEDY else jnp.zeros((num_slots, chunk), jnp.float32))

    def step(carry):
        index, kv, s, out_tokens, out_logprobs, out_routed = carry
        active = s["active"]
        if windowed:
            attend = _window_attend(s["length"], scale)
        else:
            attend = _paged_attend(page_table, s["length"], active, scale, attention, mesh, interpret)
        logits, kv, *routing = forward_with_cache(params, model_config, s["last_token"][:, None],
                                                  s["length"][:, None], kv, attend, with_routing=moe is not None,
                                                  mesh=mesh)
        if routing:
            out_routed = out_routed.at[:, index].set(token_major(routing[0].expert_ids)[:, 0])
        row_draws = jax.lax.dynamic_index_in_dim(draws, index, axis=1, keepdims=False)
        tokens, logprobs = sample_tokens(logits[:, 0], row_draws, s["temperature"], s["top_k"], s["top_p"], mode)
        out_tokens = out_tokens.at[:, index].set(jnp.where(active, tokens, -1))
        out_logprobs = out_logprobs.at[:, index].set(jnp.where(active, logprobs, 0.0))
        generated = s["generated"] + active
        stopped = (tokens[:, None] == s["stop_ids"]).any(axis=1)
        done = stopped | (generated >= s["max_new"])
        s = {**s, "generated": generated, "length": s["length"] + active, "active": active & ~done,
             "last_token": jnp.where(active, tokens, s["last_token"])}
        return index + 1, kv, s, out_tokens, out_logprobs, out_routed

    def keep_going(carry):
        index, _, s, *_ = carry
        return (index < chunk) & s["active"].any()

    kv = gather_window(cache, page_table) if windowed else cache
    # A dense model carries no routing (None: an empty leaf of the loop's state, nothing computed).
    routed = (None if moe is None else
              jnp.zeros((num_slots, chunk, len(model_config.moe_layers), moe.experts_per_token), moe.expert_id_dtype))
    init = (jnp.int32(0), kv, state, jnp.full((num_slots, chunk), -1, jnp.int32),
            jnp.zeros((num_slots, chunk), jnp.float32), routed)
    steps, kv, state, out_tokens, out_logprobs, routed = jax.lax.while_loop(keep_going, step, init)
    cache = scatter_window(cache, kv, page_table) if windowed else kv
    return out_tokens, out_logprobs, steps, state, routed, pin_kv_sharding(cache, mesh)


_DECODE_JIT = {"static_argnames": ("model_config", "chunk", "attention", "mode", "mesh", "interpret"),
               "donate_argnames": ("cache",)}
decode = jax.jit(_decode, **_DECODE_JIT)
# The same program for XLA:CPU, whose copy insertion without region analysis copied every window
# buffer twice per decode step (the loop carry, then the in-place write): a third of a batch-1 step
# for stories260K. A separate jit because other backends may not know the option.
decode_on_cpu = jax.jit(_decode, **_DECODE_JIT, compiler_options={"xla_cpu_copy_insertion_use_region_analysis": True})


def _paged_attend(page_table, lengths, active, scale, attention: str, mesh, interpret: bool):
    """Write each active slot's new token into its page, then attend over the pages."""
    positions = lengths[:, None]

    def kernel(q, k_pool, v_pool, page_table, lengths, *scale_pools):
        return paged_decode_attention(q, k_pool, v_pool, page_table, lengths, scale, *scale_pools, kernel=attention,
                                      interpret=interpret)

    def attend(layer, q, k, v, cache: KVCache):
        cache = write_layer(cache, layer, k, v, page_table, positions, active[:, None])
        k_pool, v_pool, *scale_pools = cache.layer(layer)
        scale_pools = scale_pools if cache.quantized else []
        operands = (q[:, 0], k_pool, v_pool, page_table, lengths + 1, *scale_pools)
        if attention == "reference":
            out = paged_decode_attention_reference(*operands[:5], scale, *scale_pools)
        elif mesh is None:
            out = kernel(*operands)
        else:  # each device attends with its own KV heads and the query heads they serve
            split = kv_heads_split(k_pool.shape[0], mesh)
            heads, pool, scales = heads_spec(split, 3, 1), heads_spec(split, 4, 0), heads_spec(split, 3, 0)
            out = jax.shard_map(kernel, mesh=mesh, in_specs=(heads, pool, pool, PartitionSpec(), PartitionSpec(),
                                                             *[scales] * len(scale_pools)),
                                out_specs=heads, check_vma=False)(*operands)
        return out[:, None], cache

    return attend


def _window_attend(lengths, scale):
    """Attend over the dense window and the new token, then write the new token into the window.

    Attending first leaves the write as the window's last use, so it updates the buffer in place;
    written first, the updated window fed both the attention and the loop carry, and XLA:CPU gave
    each a copy of the buffer. Every slot writes, active or not, which keeps the write unguarded
    (``DecodeWindow.write``). That is harmless: a slot owns its window row, an idle slot's row goes
    back to the sink page, and a finished slot writes past its last token, where nothing reads. The
    clamp keeps an idle slot's stale length, which the window width does not account for, inside
    the window.
    """

    def attend(layer, q, k, v, window: DecodeWindow):
        k, v = k[:, 0], v[:, 0]
        keys, values, key_scales, value_scales = window.layer(layer)
        current = (k, v)
        if key_scales is not None:  # the new token as its page will hold it, as a later step reads it
            current = tuple(dequantize_tokens(*quantize_tokens(x, keys.dtype), x.dtype) for x in current)
        out = window_decode_attention(q[:, 0], keys, values, lengths, scale, current=current,
                                      key_scales=key_scales, value_scales=value_scales)
        window = window.write(layer, jnp.minimum(lengths, window.k[layer].shape[-1] - 1), k, v)
        return out[:, None], window

    return attend
