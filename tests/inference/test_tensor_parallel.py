"""A tensor-parallel replica on the 8 simulated CPU devices (tests/conftest.py): the same tokens and
log-probs as one device, with its weights and KV pages split 1/8 per device."""

import dataclasses

import jax
import pytest

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.inference.replicas import ReplicatedEngine
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import init_params
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

pytestmark = pytest.mark.skipif(jax.local_device_count() < 8, reason="needs 8 devices (tests/conftest.py)")

DEVICES = 8
# Head counts and widths divisible by 8, so that every split matrix is split evenly.
_SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=16, num_kv_heads=8,
              head_dim=8, max_position_embeddings=128, eos_token_ids=(2,))
FAMILIES = {
    "llama": ModelConfig(architecture="llama", **_SHAPE),
    "qwen2": ModelConfig(architecture="qwen2", qkv_bias=True, tie_word_embeddings=True, **_SHAPE),
    "qwen3": ModelConfig(architecture="qwen3", qk_norm=True, tie_word_embeddings=True, **_SHAPE),
}
# Few compiled shapes (one prompt bucket, four window widths, one sampling mode): compiling is the cost.
CONFIG = EngineConfig(num_slots=4, page_size=8, num_pages=20, max_prompt_len=16, max_new_tokens=12,
                      prefill_buckets=(16,), decode_steps_per_call=6, attention_impl="window")
REQUESTS = [Request([5, 9, 33, 7],
                    SamplingParams(temperature=1.0, max_new_tokens=12, samples_per_prompt=2, ignore_eos=True), "a", 3),
            Request(list(range(20, 33)), SamplingParams(temperature=0.7, max_new_tokens=9, ignore_eos=True), "b"),
            Request([100], SamplingParams(temperature=1.3, max_new_tokens=12, ignore_eos=True), "c", 7)]


def _model(family):
    config = FAMILIES[family]
    # Larger than the 0.02 initialisation, so the logits are far from uniform and a wrong split shows.
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(config, jax.random.key(1)))
    return config, params


def _assert_split_in_eighths(array):
    shards = array.addressable_shards
    assert len(shards) == DEVICES and {shard.device for shard in shards} == set(jax.local_devices()[:DEVICES])
    assert all(shard.data.size * DEVICES == array.size for shard in shards), (array.shape, shards[0].data.shape)


# Each family compiles two engines (~25 s on 2 loaded cores): one in the fast lane, all in the slow one.
@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow),
                                    pytest.param("qwen3", marks=pytest.mark.slow)])
def test_a_tensor_parallel_replica_gives_one_devices_tokens_and_logprobs(family):
    config, params = _model(family)
    single = Engine(CONFIG, config, params).generate(REQUESTS)
    sharded_engine = Engine(dataclasses.replace(CONFIG, tensor_parallel=DEVICES), config, params)
    sharded = sharded_engine.generate(REQUESTS)
    assert [c.completion_ids for c in sharded] == [c.completion_ids for c in single]
    assert len({c.completion_ids for c in single}) == len(single), "degenerate samples would prove little"
    # Each device sums its heads' share, then the devices add the parts: the same sums reordered.
    for a, b in zip(sharded, single):
        bound = decoder_logprob_bound(config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)

    # Every matrix (and q/k/v bias) is split 1/8 per device; only the norm scales are whole.
    replicated_bytes = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(sharded_engine.params):
        if "norm" in jax.tree_util.keystr(path):
            assert leaf.sharding.is_fully_replicated
            replicated_bytes += leaf.nbytes
        else:
            _assert_split_in_eighths(leaf)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(sharded_engine.params))
    per_device = sum(shard.data.nbytes for leaf in jax.tree.leaves(sharded_engine.params)
                     for shard in leaf.addressable_shards if shard.device == jax.local_devices()[0])
    assert per_device == (total - replicated_bytes) // DEVICES + replicated_bytes
    # The KV pages too, by KV head, and still so after the donated cache went through every program.
    for pool in (*sharded_engine.cache.k, *sharded_engine.cache.v):
        _assert_split_in_eighths(pool)
        assert pool.addressable_shards[0].data.shape == (config.num_kv_heads // DEVICES, *pool.shape[1:])


@pytest.mark.slow
def test_replicas_of_four_devices_each_split_the_host():
    config, params = _model("qwen2")
    engine = ReplicatedEngine(dataclasses.replace(CONFIG, replicas=0, tensor_parallel=4), config, params)
    assert [e.devices for e in engine.engines] == [jax.local_devices()[:4], jax.local_devices()[4:8]]
    single = Engine(CONFIG, config, params).generate(REQUESTS)
    assert [c.completion_ids for c in engine.generate(REQUESTS)] == [c.completion_ids for c in single]
    engine.close()


def test_a_replica_needs_as_many_devices_as_its_tensor_parallel_degree():
    config, params = _model("llama")
    with pytest.raises(ValueError, match="tensor_parallel=8 x expert_parallel=1 needs 8 devices; got 3"):
        Engine(dataclasses.replace(CONFIG, tensor_parallel=8), config, params, devices=jax.local_devices()[:3])
    with pytest.raises(ValueError, match="replicas=3 but this process has 8 device.s., and 3 device.s. per replica .engine.tensor_parallel x expert_parallel. need 9"):
        ReplicatedEngine(dataclasses.replace(CONFIG, replicas=3, tensor_parallel=3), config, params)


@pytest.mark.slow
def test_the_pallas_kernel_runs_per_device_under_a_tensor_parallel_mesh():
    # On CPU "pallas" interprets JAX's GPU kernel; under the mesh it runs per device on its KV heads.
    config, params = _model("qwen3")
    single = Engine(CONFIG, config, params).generate(REQUESTS)
    pallas = dataclasses.replace(CONFIG, attention_impl="pallas", tensor_parallel=DEVICES)
    sharded = Engine(pallas, config, params).generate(REQUESTS)
    assert [c.completion_ids for c in sharded] == [c.completion_ids for c in single]
    # Each device sums its heads' share, then the devices add the parts: the same sums reordered.
    for a, b in zip(sharded, single):
        bound = decoder_logprob_bound(config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)
