"""The engine on an adapter-only weight version generates what the merged model generates."""

from __future__ import annotations

import jax
import numpy as np

from rlax_core.inference.config import SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models.lora import TARGETS, LoraConfig, init_adapters
from rlax_core.weights import WeightFollower, WeightStore, WeightStoreConfig
from rlax_core.weights.adapters import publish_adapters

LORA = LoraConfig(rank=4, alpha=8.0)


def merged_by_hand(params, adapters):
    """W + alpha / rank * A @ B in float64 on the host, per layer: the merged model the engine must equal."""
    merged = jax.tree.map(np.array, params)
    for target in LORA.targets:
        (module, proj), _, _ = TARGETS[target]
        ab = adapters["layers"][module][proj]
        kernel = merged["layers"][module][proj]["kernel"]
        for i in range(kernel.shape[0]):
            a = np.asarray(ab["lora_a"][i], np.float64).reshape(-1, LORA.rank)
            b = np.asarray(ab["lora_b"][i], np.float64).reshape(LORA.rank, -1)
            kernel[i] = (kernel[i].astype(np.float64) + LORA.scale * (a @ b).reshape(kernel.shape[1:])).astype(kernel.dtype)
    return merged


def test_engine_on_an_adapter_version_equals_the_merged_model(tmp_path, stories, small_engine_config):
    model, tokenizer = stories
    keys = iter(jax.random.split(jax.random.key(3), 32))
    adapters = jax.tree.map(lambda x: np.asarray(0.05 * jax.random.normal(next(keys), x.shape)),
                            init_adapters(model.config, LORA, next(keys)))
    store = WeightStore(WeightStoreConfig(root=str(tmp_path / "weights"), run_id="lora"))
    store.publish(0, model.params)
    publish_adapters(store, 1, adapters, base_version=0, lora=LORA)
    follower = WeightFollower(store)
    assert follower.refresh() and follower.version == 1

    requests = [Request(tuple(tokenizer.encode(text)), sampling, f"p{i}", seed=7)
                for i, text in enumerate(["Once upon a time", "The little dog"])
                for sampling in (SamplingParams(temperature=0.0, max_new_tokens=24),
                                 SamplingParams(temperature=1.0, samples_per_prompt=2, max_new_tokens=24))]
    engine = Engine(small_engine_config, model.config, model.params, version=0)
    base_out = engine.generate(requests)
    engine.update_weights(follower.take()[1], 1)
    adapted = engine.generate(requests)
    reference = Engine(small_engine_config, model.config, merged_by_hand(model.params, adapters), version=1).generate(requests)
    assert [c.weight_version for c in adapted] == [1] * len(adapted)
    assert [c.completion_ids for c in adapted] == [c.completion_ids for c in reference]
    for got, want in zip(adapted, reference):
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert [c.completion_ids for c in adapted] != [c.completion_ids for c in base_out]  # the adapters matter
