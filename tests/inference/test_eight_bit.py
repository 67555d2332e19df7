"""Eight-bit engines (``engine.weight_dtype``, ``engine.cache_dtype``): the quantizers' error bounds
per channel and per token of a page, eight-bit pages read by every attention path, a swap that
quantizes once per process, and (slow) the tokens of a preempting eight-bit pool (its pages swapped to
host memory and back: exactly a big pool's) and of bfloat16."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.config import ConfigError
from rlax_core.inference.attention import paged_decode_attention_reference, window_decode_attention
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.inference.kv_cache import (dequantize_tokens, gather_pages, gather_window, init_kv_cache,
                                          quantize_tokens, scatter_window, to_window_layout, write_layer)
from rlax_core.inference.pallas_attention import paged_decode_attention
from rlax_core.inference.placement import QUANTIZED_VERSIONS
from rlax_core.models.lora import dequantize_kernels, quantize_kernels
from tests.inference.test_attention import paged_problem
from tests.support.compiles import COMPILES


@pytest.mark.parametrize("dtype,bound", [("int8", 0.5 / 127), ("fp8", 2.0 ** -4)])
def test_weights_quantize_per_output_channel_within_half_a_step(stories, dtype, bound):
    model, _ = stories
    quantized = quantize_kernels(model.params, dtype)
    restored = dequantize_kernels(quantized)
    for module, proj in (("attn", "q_proj"), ("attn", "o_proj"), ("mlp", "down_proj")):
        kernel = np.asarray(model.params["layers"][module][proj]["kernel"])
        held = quantized["layers"][module][proj]
        assert held["kernel"].dtype == jnp.dtype({"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}[dtype])
        n_in = 2 if proj == "o_proj" else 1
        absmax = np.abs(kernel).max(axis=tuple(range(1, 1 + n_in)), keepdims=True)  # per layer and output channel
        error = np.abs(np.asarray(restored["layers"][module][proj]["kernel"]) - kernel)
        assert np.all(error <= bound * absmax + 1e-7), f"{module}/{proj}: over the per-channel bound"
    assert quantized["embed_tokens"]["embedding"].dtype == model.params["embed_tokens"]["embedding"].dtype


def test_kv_tokens_quantize_per_page_slot_and_head_and_read_back_through_the_pages():
    rng = np.random.default_rng(0)
    cache = init_kv_cache(2, num_pages=6, page_size=4, num_kv_heads=2, head_dim=8, dtype="int8")
    # scale rows for 8 pages: the page axis rounded up to a multiple of 8 (kv_cache.scale_pool_shape)
    assert cache.k[0].dtype == jnp.int8 and cache.k_scale[0].shape == (2, 8, 4)
    # Wildly different ranges per token and head: each keeps its own scale.
    k = rng.normal(size=(2, 5, 2, 8)).astype(np.float32) * rng.choice([1e-3, 1.0, 50.0], size=(2, 5, 2, 1))
    v = rng.normal(size=(2, 5, 2, 8)).astype(np.float32)
    page_table = np.array([[1, 3], [2, 5]], np.int32)
    positions = np.tile(np.arange(5, dtype=np.int32), (2, 1))
    cache = write_layer(cache, 1, jnp.asarray(k), jnp.asarray(v), page_table, positions, np.ones((2, 5), bool))
    keys = dequantize_tokens(gather_pages(cache.k[1], page_table), gather_pages(cache.k_scale[1], page_table))
    stored = np.asarray(keys).transpose(1, 2, 0, 3)[:, :5]  # [B, T, Hkv, D]
    absmax = np.abs(k).max(axis=-1, keepdims=True)
    assert np.all(np.abs(stored - k) <= absmax * 0.5 / 127 * (1 + 1e-5))
    assert not np.asarray(cache.k[0]).any(), "another layer's pages were written"


def _eight_bit_problem(dtype="int8"):
    lengths = [1, 3, 4, 5, 24, 11, 17]
    q, k, v, page_table, lengths = paged_problem(0, len(lengths), 8, 2, 16, 4, 6, lengths)
    (qk, sk), (qv, sv) = (quantize_tokens(jnp.asarray(x), jnp.int8 if dtype == "int8" else jnp.float8_e4m3fn)
                          for x in (k, v))
    widened = [np.asarray(dequantize_tokens(x, s)) for x, s in ((qk, sk), (qv, sv))]
    return (jnp.asarray(q), qk, qv, jnp.asarray(page_table), jnp.asarray(lengths)), (sk, sv), widened


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_window_and_reference_attention_on_eight_bit_pages_equal_attention_on_their_values(dtype):
    (q, qk, qv, page_table, lengths), scales, (k, v) = _eight_bit_problem(dtype)
    expected = paged_decode_attention_reference(q, jnp.asarray(k), jnp.asarray(v), page_table, lengths, 0.25)
    out = paged_decode_attention_reference(q, qk, qv, page_table, lengths, 0.25, *scales)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["gpu", "tpu"])
def test_pallas_kernels_read_eight_bit_pages_in_interpret_mode(kernel):
    (q, qk, qv, page_table, lengths), scales, (k, v) = _eight_bit_problem()
    expected = paged_decode_attention_reference(q, jnp.asarray(k), jnp.asarray(v), page_table, lengths, 0.25)
    out = paged_decode_attention(q, qk, qv, page_table, lengths, 0.25, *scales, kernel=kernel, interpret=True)
    # Both widen the pages to float32 in the kernel (ours on TPU: pallas_eight_bit), so they agree to rounding.
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5)


def test_an_eight_bit_window_keeps_its_scales_through_a_write_and_back_into_the_pages():
    (q, qk, qv, page_table, lengths), (sk, sv), _ = _eight_bit_problem()
    from rlax_core.inference.kv_cache import KVCache
    cache = KVCache((qk,), (qv,), (sk,), (sv,))
    window = gather_window(cache, page_table)
    new = jax.random.normal(jax.random.key(1), (7, 2, 16))
    window = window.write(0, jnp.minimum(lengths, 23), new, new)
    keys, _, key_scales, _ = window.layer(0)
    written = dequantize_tokens(keys[np.arange(7), :, :, np.minimum(np.asarray(lengths), 23)],
                                key_scales[np.arange(7), :, np.minimum(np.asarray(lengths), 23)])
    np.testing.assert_allclose(np.asarray(written), np.asarray(new), atol=float(jnp.abs(new).max()) * 0.5 / 127)
    back = scatter_window(cache, window, page_table)
    assert back.k[0].dtype == jnp.int8 and back.k_scale[0].shape == sk.shape
    again = gather_window(back, page_table)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(window)))
    out = window_decode_attention(q, *to_window_layout(gather_pages(qk, page_table), gather_pages(qv, page_table)),
                                  lengths, 0.25, key_scales=gather_pages(sk, page_table).transpose(1, 0, 2),
                                  value_scales=gather_pages(sv, page_table).transpose(1, 0, 2))
    assert out.shape == q.shape


def test_eight_bit_dtypes_are_validated():
    with pytest.raises(ConfigError, match="weight_dtype"):
        EngineConfig(weight_dtype="int4")
    with pytest.raises(ConfigError, match="cache_dtype"):
        EngineConfig(cache_dtype="int4")
    assert EngineConfig(weight_dtype="int8").eight_bit and not EngineConfig().eight_bit


def test_a_swap_quantizes_the_new_version_once_per_process_however_many_replicas(stories):
    from rlax_core.inference.replicas import ReplicatedEngine
    model, _ = stories
    config = EngineConfig(num_slots=2, page_size=8, num_pages=16, max_prompt_len=16, max_new_tokens=16,
                          prefill_buckets=(16,), weight_dtype="int8", cache_dtype="int8", replicas=2)
    before = QUANTIZED_VERSIONS["count"]
    with ReplicatedEngine(config, model.config, model.params) as engine:
        assert QUANTIZED_VERSIONS["count"] == before + 1
        new = jax.tree.map(lambda x: x * 1.01, model.params)
        engine.update_weights(new, version=1)
        assert QUANTIZED_VERSIONS["count"] == before + 2
        held = engine.engines[1].params["layers_0"]["attn"]["qkv_proj"]
        assert held["kernel"].dtype == jnp.int8 and held["kernel_scale"].dtype == jnp.float32
        assert engine.engines[1].params["embed_tokens"]["embedding"].dtype == model.params["embed_tokens"]["embedding"].dtype


# ----------------------------------------------------------------------------- whole engines (slow)

EIGHT_BIT = EngineConfig(num_slots=4, page_size=8, num_pages=64, max_prompt_len=32, max_new_tokens=48,
                         prefill_buckets=(8, 16, 32), decode_steps_per_call=8, attention_impl="window",
                         admission="reserve", weight_dtype="int8", cache_dtype="int8")


@pytest.mark.slow  # two engines' programs for two sampling modes
def test_eight_bit_pages_shared_preempted_and_resumed_give_the_tokens_of_a_big_pool(stories):
    model, tokenizer = stories
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=40, samples_per_prompt=3)  # shared prompt pages
    texts = ["Once upon a time", "The dog ran to the park and saw a big red ball", "Tom", "Lily liked to play"]
    requests = [Request(tokenizer.encode(text, add_bos=True), sampling, prompt_id=f"{name}-{i}", seed=11)
                for i, text in enumerate(texts) for name, sampling in (("g", greedy), ("s", sampled))]
    invariant = dataclasses.replace(EIGHT_BIT, batch_invariant=True)
    big = Engine(invariant, model.config, model.params)
    small = Engine(dataclasses.replace(invariant, num_pages=15, admission="on_demand"), model.config, model.params)
    expected, got = big.generate(requests), small.generate(requests)
    assert small.stats["preemptions"] >= 5 and small.stats["shared_prefills"] > 0
    assert [(c.prompt_id, c.sample_index) for c in got] == [(c.prompt_id, c.sample_index) for c in expected]
    # Preempted sequences' pages (and their scales) went to host memory and came back bit for bit
    # (``engine.preemption`` auto: swap for eight-bit pages), and a prompt's prefill does not depend on
    # what was admitted with it (``batch_invariant``): every token and log-prob is the big pool's.
    assert [(c.completion_ids, c.logprobs) for c in got] == [(c.completion_ids, c.logprobs) for c in expected]


@pytest.mark.slow
def test_an_eight_bit_engine_compiles_nothing_after_warm_up_across_lengths_and_swaps(stories):
    from rlax_core.inference.sampling import SamplingMode
    model, _ = stories
    # A pool of 14 pages preempts: the swaps' read and write of eight-bit pages compiled at warm-up too.
    engine = Engine(dataclasses.replace(EIGHT_BIT, admission="on_demand", num_pages=15), model.config, model.params,
                    device=jax.devices()[0])
    engine.warm_up(modes=(SamplingMode.GREEDY,))
    # A swap of the kind the loop makes (new device buffers) compiles the quantizing programs once:
    # arrays committed elsewhere (the loaded checkpoint's) are another signature of them.
    engine.update_weights(jax.tree.map(lambda x: x * 1.0, model.params), 1)
    rng = np.random.default_rng(0)
    before = COMPILES.count
    for round_index in range(3):
        lengths = rng.integers(1, 33, int(rng.integers(1, 7)))
        params = SamplingParams(temperature=0.0, max_new_tokens=int(rng.integers(1, 48)), ignore_eos=True)
        engine.generate([Request(rng.integers(3, 512, n).tolist(), params) for n in lengths])
        engine.update_weights(jax.tree.map(lambda x: x * 1.0, model.params), engine.version + 1)
    assert COMPILES.count == before, f"{COMPILES.count - before} compilations after warm-up"
    assert engine.stats["preemptions"] > 0


@pytest.mark.slow  # two engines over the 64 held-out prompts, then the bfloat16 policy scores their tokens
def test_int8_greedy_rollouts_agree_with_bfloat16_on_nine_tokens_in_ten():
    from benchmarks.eight_bit_rollouts import compare
    report = compare(prompts=64, dtype="int8")
    print(json.dumps(report))
    assert report["agreement"] >= 0.9, report
    assert report["mismatch_kl"] >= 0 and np.isfinite(report["mismatch_kl"])

