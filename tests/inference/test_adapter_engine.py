"""The engine on an adapter version generates what the merged model generates: merged into the
kernels or run on the fly (``engine.lora_mode``), on one device and tensor-parallel."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from rlax_core.config import ConfigError
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.inference.replicas import ReplicatedEngine
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import init_adapters
from rlax_core.models.lora_config import TARGETS, LoraConfig
from rlax_core.models.transformer import init_params
from rlax_core.weights import WeightFollower, WeightStore, WeightStoreConfig
from rlax_core.weights.adapters import publish_adapters
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

LORA = LoraConfig(rank=4, alpha=8.0)
# q and v but not k, gate but not up: the fused adapters' zero blocks are exercised too.
PARTIAL = LoraConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "gate", "down"))


def random_adapters(model_config, lora, seed=3):
    keys = iter(jax.random.split(jax.random.key(seed), 32))
    return jax.tree.map(lambda x: np.asarray(0.05 * jax.random.normal(next(keys), x.shape)),
                        init_adapters(model_config, lora, next(keys)))


def merged_by_hand(params, adapters, lora):
    """W + alpha / rank * A @ B in float64 on the host, per layer: the merged model the engine must equal."""
    merged = jax.tree.map(np.array, params)
    for target in lora.targets:
        (module, proj), _, _ = TARGETS[target]
        ab = adapters["layers"][module][proj]
        kernel = merged["layers"][module][proj]["kernel"]
        for i in range(kernel.shape[0]):
            a = np.asarray(ab["lora_a"][i], np.float64).reshape(-1, lora.rank)
            b = np.asarray(ab["lora_b"][i], np.float64).reshape(lora.rank, -1)
            kernel[i] = (kernel[i].astype(np.float64) + lora.scale * (a @ b).reshape(kernel.shape[1:])).astype(kernel.dtype)
    return merged


def assert_same_generations(got, want, model_config):
    """The same tokens; log-probs within the bound of float32 sums in another order: on the fly against
    merged, x @ W and (x @ A) @ B are rounded apart instead of one rounded W'."""
    assert [c.completion_ids for c in got] == [c.completion_ids for c in want]
    for a, b in zip(got, want):
        bound = decoder_logprob_bound(model_config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)


def test_engine_config_names_its_lora_modes():
    from rlax_core.inference.placement import lora_mode_for

    assert lora_mode_for("on_the_fly", "cpu") == "on_the_fly"
    # "auto" is what docs/lora.md says: merged, on every platform.
    assert [lora_mode_for("auto", platform) for platform in ("cpu", "tpu", "gpu")] == ["merged"] * 3
    with pytest.raises(ConfigError, match="lora_mode"):
        EngineConfig(lora_mode="fused")


@pytest.mark.parametrize("lora", [LORA, PARTIAL], ids=["all-targets", "some-targets"])
def test_engine_on_an_adapter_version_equals_the_merged_model(tmp_path, stories, small_engine_config, lora):
    model, tokenizer = stories
    adapters = random_adapters(model.config, lora)
    requests = [Request(tuple(tokenizer.encode(text)), sampling, f"p{i}", seed=7)
                for i, text in enumerate(["Once upon a time", "The little dog"])
                for sampling in (SamplingParams(temperature=0.0, max_new_tokens=24),
                                 SamplingParams(temperature=1.0, samples_per_prompt=2, max_new_tokens=24))]
    reference = Engine(small_engine_config, model.config, merged_by_hand(model.params, adapters, lora),
                       version=1).generate(requests)

    # The merged mode equals the merged model (float64 merge on the host); the on-the-fly mode equals the merged mode.
    for mode in ("merged", "on_the_fly"):
        engine = Engine(dataclasses.replace(small_engine_config, lora_mode=mode), model.config, model.params, version=0)
        assert engine.lora_mode == mode
        base_out, base_params = engine.generate(requests), engine.params
        engine.update_adapters(adapters, lora, 1)
        adapted = engine.generate(requests)
        assert [c.weight_version for c in adapted] == [1] * len(adapted)
        assert_same_generations(adapted, reference, model.config)
        assert [c.completion_ids for c in adapted] != [c.completion_ids for c in base_out]  # the adapters matter
        reference = adapted
        if mode == "on_the_fly":  # the base's own arrays, the adapters beside them: nothing merged
            layer, base_layer = engine.params["layers_0"], base_params["layers_0"]
            assert layer["attn"]["qkv_proj"]["kernel"] is base_layer["attn"]["qkv_proj"]["kernel"]
            assert "lora_a" in layer["attn"]["qkv_proj"] and "lora_a" in layer["mlp"]["down_proj"]

    if lora is LORA:  # through the weight store: the follower hands the merged model to update_weights
        store = WeightStore(WeightStoreConfig(root=str(tmp_path / "weights"), run_id="lora"))
        store.publish(0, model.params)
        publish_adapters(store, 1, adapters, base_version=0, lora=lora)
        follower = WeightFollower(store)
        assert follower.refresh() and follower.version == 1
        engine = Engine(small_engine_config, model.config, model.params, version=0)
        engine.update_weights(follower.take()[1], 1)
        assert_same_generations(engine.generate(requests), reference, model.config)


@pytest.mark.parametrize("mode", ["merged", "on_the_fly"])
def test_a_follower_hands_the_engine_the_adapters_alone_and_it_generates_the_merged_models_tokens(
        tmp_path, stories, small_engine_config, mode):
    """A rollout worker's path (``WeightFollower(merge_adapters=False).hand_to``): a full version, then
    two adapter versions on it. Each adapter version reads its adapters and nothing else; the replicated
    engine, holding the base, generates what an engine given the merged params generates."""
    model, tokenizer = stories
    config = WeightStoreConfig(root=str(tmp_path / "weights"), run_id="lora")
    writer, reader = WeightStore(config), WeightStore(config)
    writer.publish(0, model.params)
    adapters = {v: random_adapters(model.config, LORA, seed=v) for v in (1, 2)}
    adapter_bytes = {v: publish_adapters(writer, v, adapters[v], base_version=0, lora=LORA).nbytes for v in (1, 2)}
    requests = [Request(tuple(tokenizer.encode(text)), SamplingParams(temperature=0.0, max_new_tokens=16), f"p{i}")
                for i, text in enumerate(["Once upon a time", "The little dog"])]

    def merged_model_generates(params):
        return Engine(small_engine_config, model.config, params).generate(requests)

    # The engine starts on other weights (a worker's start on its model folder): version 0 replaces them.
    engine = ReplicatedEngine(dataclasses.replace(small_engine_config, lora_mode=mode), model.config,
                              jax.tree.map(lambda x: 0.5 * x, model.params), version=-1)
    follower = WeightFollower(reader, merge_adapters=False)
    assert follower.refresh(up_to=0) and follower.hand_to(engine) == 0 and follower.hand_to(engine) is None
    assert reader.counters["read_bytes"] == writer.manifest(0).nbytes
    assert_same_generations(engine.generate(requests), merged_model_generates(model.params), model.config)
    for version in (1, 2):
        read, loads = reader.counters["read_bytes"], reader.counters["loaded"]
        assert follower.refresh(up_to=version) and follower.hand_to(engine) == version
        assert reader.counters["loaded"] - loads == 1  # the adapter version alone, not its base again
        assert reader.counters["read_bytes"] - read == adapter_bytes[version] < writer.manifest(0).nbytes / 10
        generated = engine.generate(requests)
        assert {c.weight_version for c in generated} == {version}
        assert_same_generations(generated, merged_model_generates(merged_by_hand(model.params, adapters[version], LORA)),
                                model.config)
    engine.close()


def test_a_follower_that_does_not_merge_hands_over_a_base_it_loaded_for_a_version_never_handed_over(tmp_path, stories):
    """Two adapter versions on a base the engine does not hold, loaded before the engine takes either:
    the second load reads only its adapters, and the hand-over still carries the base."""
    model, _ = stories
    config = WeightStoreConfig(root=str(tmp_path / "weights"), run_id="lora")
    writer, reader = WeightStore(config), WeightStore(config)
    writer.publish(0, model.params)
    publish_adapters(writer, 1, random_adapters(model.config, LORA, seed=1), base_version=0, lora=LORA)
    follower = WeightFollower(reader, merge_adapters=False, as_numpy=True)
    assert follower.refresh(up_to=1) and follower.parts.params is not None  # the base, read with the adapters
    publish_adapters(writer, 2, random_adapters(model.config, LORA, seed=2), base_version=0, lora=LORA)
    assert follower.refresh() and reader.counters["loaded"] == 3  # base, adapters 1, adapters 2
    parts = follower.parts
    assert parts.version == 2 and parts.base.version == 0 and parts.params is not None
    with pytest.raises(RuntimeError, match="hand_to"):
        follower.take()


# Head counts and widths divisible by 8 (as tests/inference/test_tensor_parallel.py), 8 simulated devices.
TP_MODEL = ModelConfig(architecture="qwen2", qkv_bias=True, vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_layers=2, num_heads=16, num_kv_heads=8, head_dim=8, max_position_embeddings=128,
                       eos_token_ids=(2,))
TP_CONFIG = EngineConfig(num_slots=4, page_size=8, num_pages=20, max_prompt_len=16, max_new_tokens=12,
                         prefill_buckets=(16,), decode_steps_per_call=6, attention_impl="window")
TP_REQUESTS = [Request([5, 9, 33, 7], SamplingParams(temperature=1.0, max_new_tokens=12, samples_per_prompt=2,
                                                     ignore_eos=True), "a", 3),
               Request(list(range(20, 33)), SamplingParams(temperature=0.0, max_new_tokens=9, ignore_eos=True), "b")]


@pytest.mark.skipif(jax.local_device_count() < 8, reason="needs 8 devices (tests/conftest.py)")
@pytest.mark.parametrize("mode", ["on_the_fly", pytest.param("merged", marks=pytest.mark.slow)])
def test_a_tensor_parallel_engine_on_adapters_equals_one_device(mode):
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(TP_MODEL, jax.random.key(1)))
    adapters = jax.tree.map(lambda x: 4 * x, random_adapters(TP_MODEL, LORA))  # large enough to move the tokens
    reference = Engine(dataclasses.replace(TP_CONFIG, lora_mode=mode), TP_MODEL, params)
    reference.update_adapters(adapters, LORA, 1)
    reference = reference.generate(TP_REQUESTS)
    merged_reference = Engine(TP_CONFIG, TP_MODEL, merged_by_hand(params, adapters, LORA)).generate(TP_REQUESTS)
    assert [c.completion_ids for c in reference] == [c.completion_ids for c in merged_reference]
    engine = Engine(dataclasses.replace(TP_CONFIG, tensor_parallel=8, lora_mode=mode), TP_MODEL, params)
    engine.update_adapters(adapters, LORA, 1)
    assert_same_generations(engine.generate(TP_REQUESTS), reference, TP_MODEL)
    # Tensor parallelism is unchanged: each device holds 1/8 of the kernels, and of B's heads on the fly.
    q_proj = engine.params["layers_0"]["attn"]["q_proj"]
    leaves = [q_proj["kernel"], q_proj["lora_b"]] if mode == "on_the_fly" else [q_proj["kernel"]]
    for leaf in leaves:
        assert all(shard.data.size * 8 == leaf.size for shard in leaf.addressable_shards)
