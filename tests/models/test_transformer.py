"""Config parsing and forward-pass properties on random toy models."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.config import ConfigError
from rlax_core.models import (
    ModelConfig, RopeScaling, forward, forward_with_cache, fuse_projections, init_cache, init_params,
    param_logical_axes, toy_config, unstack_layers)
from rlax_core.models.config import rope_inverse_frequencies
from tests.support.tolerances import assert_reordered_close, decoder_logit_bound

# Compiled once per shape: eager Flax re-traces the layer scan on every call.
forward = jax.jit(forward, static_argnames=("config", "remat"))
forward_with_cache = jax.jit(forward_with_cache, static_argnames=("config",))

QWEN2_V4 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": True,
    "max_position_embeddings": 32768, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "use_sliding_window": False, "sliding_window": 32768,
}


def test_transformers_4_and_5_layouts_give_the_same_config():
    v5 = {k: v for k, v in QWEN2_V4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    v4 = dict(QWEN2_V4, vocab_size=152000, bos_token_id=151643, eos_token_id=[151645, 151643])
    v5 = dict(v5, vocab_size=152000, eos_token_id=[151645, 151643])
    a, b = ModelConfig.from_hf(v4), ModelConfig.from_hf(v5)
    assert a == b
    assert (a.architecture, a.qkv_bias, a.qk_norm, a.head_dim, a.rope_theta) == ("qwen2", True, False, 16, 1e6)
    assert a.eos_token_ids == (151645, 151643) and a.eos_token_id == 151645


def test_llama3_rope_scaling_is_read_from_both_layouts():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    base = dict(QWEN2_V4, architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=1000,
                bos_token_id=1, eos_token_id=2)
    v4 = dict(base, rope_theta=500000.0, rope_scaling=scaling)
    v5 = dict(base, rope_parameters=dict(scaling, rope_theta=500000.0))
    v5.pop("rope_theta")
    assert ModelConfig.from_hf(v4) == ModelConfig.from_hf(v5)
    config = ModelConfig.from_hf(v4)
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    plain = rope_inverse_frequencies(dataclasses.replace(config, rope_scaling=None))
    scaled = rope_inverse_frequencies(config)
    assert scaled[0] == plain[0]  # the fastest rotation is kept
    assert scaled[-1] == pytest.approx(plain[-1] / 8.0)  # the slowest is slowed by the factor
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_invalid_shapes_are_named():
    with pytest.raises(ConfigError) as error:
        toy_config(num_kv_heads=3)
    assert error.value.path == "num_kv_heads"
    with pytest.raises(ConfigError, match="config.json vocab_size: missing"):
        ModelConfig.from_hf({k: v for k, v in QWEN2_V4.items() if k != "vocab_size"})


def test_logical_axes_cover_every_parameter():
    config = toy_config(architecture="qwen3", qkv_bias=False, qk_norm=True, tie_word_embeddings=False)
    params = init_params(config, jax.random.key(0))
    axes = param_logical_axes(config)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(params)
    for names, value in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(params)):
        assert len(names) == value.ndim
    assert axes["layers"]["attn"]["q_proj"]["kernel"] == ("layers", "embed", "heads", "head_dim")
    assert axes["layers"]["attn"]["k_proj"]["kernel"] == ("layers", "embed", "kv_heads", "head_dim")
    assert axes["layers"]["mlp"]["gate_proj"]["kernel"] == ("layers", "embed", "mlp")
    assert axes["lm_head"] == ("embed", "vocab")
    assert sum(x.size for x in jax.tree.leaves(params)) == config.num_params


@pytest.fixture(scope="module")
def toy():
    config = toy_config()
    return config, init_params(config, jax.random.key(0))


def test_padding_does_not_change_the_real_tokens_logits(toy):
    config, params = toy
    ids = jax.random.randint(jax.random.key(1), (1, 6), 3, config.vocab_size)
    alone = forward(params, config, ids)
    left = forward(params, config, jnp.pad(ids, ((0, 0), (3, 0))), attention_mask=jnp.pad(jnp.ones((1, 6), int), ((0, 0), (3, 0))))
    right = forward(params, config, jnp.pad(ids, ((0, 0), (0, 3))), attention_mask=jnp.pad(jnp.ones((1, 6), int), ((0, 0), (0, 3))))
    np.testing.assert_allclose(left[:, 3:], alone, atol=1e-5)
    np.testing.assert_allclose(right[:, :6], alone, atol=1e-5)
    assert np.isfinite(np.asarray(left)).all()


def test_bfloat16_params_give_float32_logits_close_to_float32(toy):
    config, params = toy
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, config.vocab_size)
    full = forward(params, config, ids)
    half = forward(jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), config, ids)
    assert half.dtype == jnp.float32
    np.testing.assert_allclose(half, full, atol=0.05)


def test_cached_prefill_and_decode_equal_the_full_forward(toy):
    config, params = toy
    ids = jax.random.randint(jax.random.key(3), (2, 9), 0, config.vocab_size)
    full = forward(params, config, ids)
    cache = init_cache(config, batch=2, max_len=16)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    prefill, cache = forward_with_cache(params, config, ids[:, :5], positions[:, :5], cache)
    np.testing.assert_allclose(prefill, full[:, :5], atol=1e-5)
    for t in range(5, 9):  # one token at a time: one compile
        step, cache = forward_with_cache(params, config, ids[:, t:t + 1], positions[:, t:t + 1], cache)
        np.testing.assert_allclose(step[:, 0], full[:, t], atol=1e-5)


def test_unstacked_layers_give_the_stacked_forward(toy):
    config, params = toy
    unstacked = unstack_layers(params)
    assert "layers" not in unstacked and sorted(k for k in unstacked if k.startswith("layers_")) == [
        f"layers_{i}" for i in range(config.num_layers)]
    np.testing.assert_array_equal(unstacked["layers_1"]["mlp"]["up_proj"]["kernel"],
                                  params["layers"]["mlp"]["up_proj"]["kernel"][1])
    ids = jax.random.randint(jax.random.key(5), (2, 6), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    stacked, _ = forward_with_cache(params, config, ids, positions, init_cache(config, batch=2, max_len=16))
    unrolled, _ = forward_with_cache(unstacked, config, ids, positions, init_cache(config, batch=2, max_len=16))
    np.testing.assert_allclose(unrolled, stacked, atol=1e-6)


@pytest.mark.parametrize("variant", [{}, {"architecture": "qwen3", "qkv_bias": False, "qk_norm": True}])
def test_fused_projections_give_the_same_forward_stacked_and_unstacked(variant):
    config = toy_config(**variant)  # qwen2 (q/k/v biases), then qwen3 (q/k norms)
    params = init_params(config, jax.random.key(1))
    fused = fuse_projections(params)
    attn, mlp = fused["layers"]["attn"], fused["layers"]["mlp"]
    assert "q_proj" not in attn and "gate_proj" not in mlp
    heads = config.num_heads + 2 * config.num_kv_heads
    assert attn["qkv_proj"]["kernel"].shape == (config.num_layers, config.hidden_size, heads, config.head_dim)
    assert ("bias" in attn["qkv_proj"]) == config.qkv_bias
    assert mlp["gate_up_proj"]["kernel"].shape == (config.num_layers, config.hidden_size, 2 * config.intermediate_size)
    ids = jax.random.randint(jax.random.key(5), (2, 6), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    reference = forward(params, config, ids)
    bound = decoder_logit_bound(config, context=6)  # one product for three: the same sums, another order
    assert_reordered_close(forward(fused, config, ids), reference, bound)
    for layout in (fused, fuse_projections(unstack_layers(params))):
        logits, _ = forward_with_cache(layout, config, ids, positions, init_cache(config, batch=2, max_len=16))
        assert_reordered_close(logits, reference, bound)


@pytest.mark.slow  # two gradient compiles
def test_remat_changes_memory_not_gradients(toy):
    config, params = toy
    ids = jax.random.randint(jax.random.key(4), (2, 8), 0, config.vocab_size)

    def loss(p, remat):
        return jax.nn.log_softmax(forward(p, config, ids, remat=remat)).mean()

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    plain, rematted = grad(params, False), grad(params, True)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(rematted)):
        np.testing.assert_allclose(a, b, atol=1e-6)
