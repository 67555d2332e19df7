"""Sparse upcycling: a dense Llama-family model's MLPs copied into the experts of a Mixtral-style mixture.

    config, params = upcycle(dense.config, dense.params, num_experts=4, experts_per_token=2, noise=0.01,
                             rng=jax.random.key(0))

Every layer's MLP becomes ``num_experts`` experts, each a copy of it whose weights get independent
noise ``noise * std(W) * N(0, 1)`` (relative to each kernel's own spread), and a router with small
random weights (``INIT_STDDEV``) is added. Mixtral renormalises the chosen experts' weights to sum to
one, so with ``noise=0`` every expert is the original MLP and the mixture computes the dense model's
logits, whatever it routes (the test of this module). The noise lets the experts drift apart once
trained (Komatsuzaki et al. 2022, *Sparse Upcycling*, copy the MLP as is; the noise breaks the experts'
symmetry so that the router has something to choose between from the first step).

The result saves as a ``MixtralForCausalLM`` folder (Llama's attention, every layer sparse), which
``from_pretrained`` and transformers both read: ``upcycle_folder`` writes one from a model folder, for
``rlax upcycle`` and for a run whose recipe sets ``model.upcycle`` (``pipelines/initial_policy.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlax_core.config import require
from rlax_core.models.config import INIT_STDDEV, ModelConfig, MoeConfig
from rlax_core.models.transformer import Params


def upcycled_config(config: ModelConfig, *, num_experts: int, experts_per_token: int) -> ModelConfig:
    """The Mixtral config ``upcycle`` makes of a dense Llama ``config``: its shape without its weights
    (what a planner or a compiler needs before the mixture is written)."""
    require(config.architecture == "llama" and config.moe is None, "architecture",
            f"upcycling takes a dense Llama-family model (Mixtral is Llama with sparse layers), not "
            f"{config.architecture}{' with experts' if config.moe is not None else ''}")
    require(not config.rope_interleaved, "rope_interleaved", "load llama2.c weights with half-split RoPE (the default)")
    moe = MoeConfig(num_experts=num_experts, experts_per_token=experts_per_token,
                    expert_intermediate_size=config.intermediate_size, normalize_top_k=True)
    return dataclasses.replace(config, architecture="mixtral", moe=moe)


def upcycle(config: ModelConfig, params: Params, *, num_experts: int, experts_per_token: int, noise: float,
            rng: jax.Array) -> tuple[ModelConfig, Params]:
    """A Mixtral config and its params from a dense Llama ``config`` and ``params`` (stacked layers)."""
    require(noise >= 0, "noise", "must be >= 0")
    sparse = upcycled_config(config, num_experts=num_experts, experts_per_token=experts_per_token)
    layers = dict(params["layers"])
    mlp = layers.pop("mlp")
    router_key, *noise_keys = jax.random.split(rng, 4)
    experts = {}
    for (name, leaf), key in zip(sorted(mlp.items()), noise_keys):
        kernel = leaf["kernel"]  # [layers, in, out]
        copies = jnp.broadcast_to(kernel[:, None], (kernel.shape[0], num_experts, *kernel.shape[1:]))
        spread = jnp.std(kernel.astype(jnp.float32), axis=(1, 2), keepdims=True)[:, None]
        jitter = noise * spread * jax.random.normal(key, copies.shape, jnp.float32)
        experts[name] = (copies.astype(jnp.float32) + jitter).astype(kernel.dtype)
    router = INIT_STDDEV * jax.random.normal(router_key, (config.num_layers, config.hidden_size, num_experts))
    layers["moe"] = {**experts, "router": router.astype(kernel.dtype)}
    return sparse, {**params, "layers": layers}


def upcycle_folder(source: str, destination: str, *, num_experts: int, experts_per_token: int, noise: float,
                   seed: int) -> ModelConfig:
    """Upcycle the dense model at ``source`` (a Hugging Face folder or llama2.c ``.bin``) and write the
    mixture as a Hugging Face folder at ``destination`` (local or gs://), its tokenizer beside it;
    returns its config. ``rlax upcycle`` and a run's ``model.upcycle`` both make their folders here."""
    from rlax_core.models.checkpoint import from_pretrained
    from rlax_core.models.export import export_hf

    dense = from_pretrained(source)
    config, params = upcycle(dense.config, dense.params, num_experts=num_experts, experts_per_token=experts_per_token,
                             noise=noise, rng=jax.random.key(seed))
    export_hf(destination, config, params, tokenizer_source=source)
    return config
