"""The baselines' settings in one place: each library set up as a careful user of it would set it up
for the same job as ours, and the settings every benchmark prints beside its figures.

A fair baseline runs in our dtype, recomputes nothing that ours keeps (activation checkpointing
saves memory a 260K or 25M model does not need, at the price of a second forward), and has its
library's fast paths on: every core as a torch thread, PyTorch's fused SDPA attention, the KV cache
in ``generate``, ``inference_mode`` where nothing is trained.

The settings are plain keyword dicts, the very ones the benchmarks pass to the libraries, so that
``tests/foundation/test_fair_baselines.py`` reads them without torch; :func:`trl_precision` and
:func:`transformers_precision` read them the way the libraries do, defaults included, and
:func:`rlax_precision` reads ours from the trainer's config.
"""

from __future__ import annotations

import os

# Our side, where no recipe says otherwise: float32 weights, activations kept (rlax_core's defaults:
# TrainerConfig.param_dtype / remat, the models' float32 params).
OUR_DTYPE = "float32"

# TRL's GRPOConfig overrides transformers' defaults with bf16 autocast and activation checkpointing
# (trl 1.16: "gradient_checkpointing: defaults to True", "bf16: defaults to True if fp16 is not set");
# transformers 5 reads the old name gradient_checkpointing only when activation_checkpointing is unset.
TRL_GRPO_DEFAULTS = {"bf16": True, "fp16": False, "gradient_checkpointing": True, "activation_checkpointing": None}

# GRPOConfig keywords that make TRL's step ours in precision: float32 math, nothing recomputed.
TRL_GRPO_FAIR = {"bf16": False, "fp16": False, "activation_checkpointing": False, "use_cpu": True}

# AutoModelForCausalLM.from_pretrained keywords: our dtype and PyTorch's fused attention (the
# default where available, named so that the JSON says which kernel ran).
TRANSFORMERS_LOAD_FAIR = {"dtype": OUR_DTYPE, "attn_implementation": "sdpa"}

# model.generate keywords beyond the job's own (lengths, greedy or sampled): the KV cache on.
TRANSFORMERS_GENERATE_FAIR = {"use_cache": True}


def torch_threads() -> int:
    """Every core as a torch thread, as each core is a JAX device on our side."""
    return os.cpu_count() or 1


def load_options(load: dict = TRANSFORMERS_LOAD_FAIR) -> dict:
    """``from_pretrained`` keywords with the dtype as a torch dtype (torch imported here, on use)."""
    import torch

    return {**load, "dtype": getattr(torch, load["dtype"])}


def setup_torch() -> None:
    """The torch process-wide settings every baseline runs under."""
    import torch

    torch.set_num_threads(torch_threads())


def trl_precision(grpo_options: dict, load: dict = TRANSFORMERS_LOAD_FAIR) -> dict:
    """dtype and recomputation of a TRL GRPO run built from ``GRPOConfig(**grpo_options)`` on a model
    loaded with ``from_pretrained(**load)``: TRL's defaults where the options are silent."""
    merged = {**TRL_GRPO_DEFAULTS, **grpo_options}
    dtype = "bfloat16" if merged["bf16"] else "float16" if merged["fp16"] else load["dtype"]
    checkpointing = merged["activation_checkpointing"]
    if checkpointing is None:
        checkpointing = merged["gradient_checkpointing"]
    return {"dtype": dtype, "recomputation": bool(checkpointing)}


def transformers_precision(load: dict) -> dict:
    """dtype and recomputation of transformers' inference on a model loaded with ``from_pretrained(**load)``
    (nothing is recomputed without a backward pass)."""
    return {"dtype": load["dtype"], "recomputation": False}


def rlax_precision(trainer_config) -> dict:
    """dtype and recomputation of our update under a ``TrainerConfig``."""
    return {"dtype": trainer_config.param_dtype, "recomputation": trainer_config.remat}


def trl_settings(grpo_options: dict, load: dict = TRANSFORMERS_LOAD_FAIR) -> dict:
    """What a benchmark's JSON prints of its TRL baseline."""
    return {**trl_precision(grpo_options, load), "grpo_config": _printable(grpo_options),
            "from_pretrained": _printable(load), "torch_threads": torch_threads()}


def transformers_settings(load: dict, generate: dict | None = None) -> dict:
    """What a benchmark's JSON prints of its transformers baseline."""
    settings = {**transformers_precision(load), "from_pretrained": _printable(load), "torch_threads": torch_threads(),
                "inference_mode": True}
    if generate is not None:
        settings["generate"] = _printable(generate)
    return settings


def _printable(options: dict) -> dict:
    return {k: v if isinstance(v, (bool, int, float, str, type(None))) else str(v) for k, v in options.items()}
