"""An expert-parallel engine replica on the 8 simulated CPU devices (tests/conftest.py): stories260K
upcycled into 4 experts (top 2) generates one device's tokens with its experts split 4 and 2 ways."""

import dataclasses

import jax
import pytest

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models.upcycle import upcycle
from tests.support.device_bytes import bytes_on
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

pytestmark = pytest.mark.skipif(jax.local_device_count() < 8, reason="needs 8 devices (tests/conftest.py)")

# Few compiled shapes (one prompt bucket, one sampling mode): compiling is the cost.
CONFIG = EngineConfig(num_slots=4, page_size=8, num_pages=20, max_prompt_len=16, max_new_tokens=12,
                      prefill_buckets=(16,), decode_steps_per_call=6, attention_impl="window")
REQUESTS = [Request([1, 403, 407, 261], SamplingParams(temperature=1.0, max_new_tokens=12, samples_per_prompt=2,
                                                       ignore_eos=True), "a", 3),
            Request([1, 378, 30, 61, 90, 261, 407], SamplingParams(temperature=0.0, max_new_tokens=9, ignore_eos=True),
                    "b"),
            Request([1], SamplingParams(temperature=1.3, max_new_tokens=12, ignore_eos=True), "c", 7)]


@pytest.fixture(scope="module")
def mixture(stories):
    """stories260K's MLP copied into 4 experts with noise, so that which experts run changes the logits."""
    model, _ = stories
    return upcycle(model.config, model.params, num_experts=4, experts_per_token=2, noise=0.05, rng=jax.random.key(0))


@pytest.fixture(scope="module")
def single(mixture):
    return Engine(CONFIG, *mixture).generate(REQUESTS)


# Each shape compiles an engine (~15 s on 2 loaded cores besides the one-device engine's): expert 4 in the
# fast lane, expert 2 x tensor 2 in the slow one.
@pytest.mark.parametrize("expert_parallel,tensor_parallel", [(4, 1), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_an_expert_parallel_replica_gives_one_devices_tokens(mixture, single, expert_parallel, tensor_parallel):
    config, params = mixture
    engine = Engine(dataclasses.replace(CONFIG, expert_parallel=expert_parallel, tensor_parallel=tensor_parallel),
                    config, params)
    assert dict(engine.mesh.shape)["expert"] == expert_parallel and len(engine.devices) == 4
    sharded = engine.generate(REQUESTS)
    assert [c.completion_ids for c in sharded] == [c.completion_ids for c in single]
    assert len({c.completion_ids for c in single}) == len(single), "degenerate samples would prove little"
    # Each device adds its experts' part, then the devices add the parts: the same sums reordered.
    for a, b in zip(sharded, single):
        bound = decoder_logprob_bound(config, context=len(a.prompt_ids) + len(a.completion_ids))
        assert_reordered_close(a.logprobs, b.logprobs, bound)
    # Each device holds its 4 / expert_parallel experts of every sparse layer (each expert's hidden
    # units split by tensor_parallel where they divide), and no more.
    experts = engine.params["layers_0"]["moe"]["gate_proj"]
    assert experts.addressable_shards[0].data.shape[0] == 4 // expert_parallel
    assert bytes_on(engine.devices[0], [experts]) * expert_parallel * tensor_parallel == experts.nbytes


def test_the_experts_must_divide_and_a_dense_model_has_none(stories, mixture):
    model, _ = stories
    with pytest.raises(ValueError, match="expert_parallel=2: the model is dense"):
        Engine(dataclasses.replace(CONFIG, expert_parallel=2), model.config, model.params)
    with pytest.raises(ValueError, match="expert_parallel=8 does not divide the model's 4 experts"):
        Engine(dataclasses.replace(CONFIG, expert_parallel=8), *mixture)
