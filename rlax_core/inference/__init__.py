"""The rollout engine: compiled batched generation over a paged KV cache.

    from rlax_core.inference import Engine, EngineConfig, Request, SamplingParams

    engine = Engine(EngineConfig(num_slots=16), model.config, model.params, version=0)
    sampling = SamplingParams(temperature=1.0, samples_per_prompt=4)
    completions = engine.generate([Request(prompt_ids, sampling, "id-17", seed=0)])

See ``engine`` for scheduling and weight swaps, ``programs`` for the compiled prefill and decode,
``sampling`` for keys and log-probs, ``kv_cache`` for the paged cache and the decode window,
``attention`` / ``pallas_attention`` for the decode attention (JAX's Pallas kernels on TPU and GPU),
``replicas`` for one engine per device or per group of devices (data-parallel generation within a
host), ``sharding`` for one engine over a group (tensor parallel), ``adapters`` for LoRA adapter
versions merged or run on the fly.
"""

from rlax_core.utils.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ["EngineConfig", "SamplingParams"],
    "engine": ["Completion", "Engine", "Request"],
    "replicas": ["ReplicatedEngine"],
})
