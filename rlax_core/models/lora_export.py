"""LoRA adapters in and out of the Hugging Face PEFT format.

    export_peft("out/adapter", config, lora, adapters, base_model="Qwen/Qwen2.5-7B")
    # out/adapter/adapter_config.json, adapter_model.safetensors: PeftModel.from_pretrained(base, "out/adapter")
    lora, adapters = load_peft("out/adapter", config)

PEFT keeps ``lora_A.weight [rank, in_features]`` and ``lora_B.weight [out_features, rank]`` per
projection, named after the module (``base_model.model.model.layers.3.self_attn.q_proj``) and scaled
by ``lora_alpha / r``: the transposes of our A ``[in..., rank]`` and B ``[rank, out...]`` flattened,
the same scale. A merged full folder is ``export_hf`` of ``lora.merge(base, adapters)``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rlax_core.models.checkpoint import CheckpointError, local_copy
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import adapter_shapes
from rlax_core.models.lora_config import TARGETS, LoraConfig

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
_HF_MODULE = {"attn": "self_attn", "mlp": "mlp"}


def _peft_name(layer: int, target: str, matrix: str) -> str:
    (module, proj), _, _ = TARGETS[target]
    return f"base_model.model.model.layers.{layer}.{_HF_MODULE[module]}.{proj}.lora_{matrix}.weight"


def export_peft(destination: str | os.PathLike, config: ModelConfig, lora: LoraConfig, adapters: Any, *,
                base_model: str | None = None) -> list[str]:
    """Write a PEFT LoRA folder (local or gs://) for stacked ``adapters``; returns the file names written."""
    from safetensors.numpy import save_file

    from rlax_core.utils.storage import open_storage

    if config.rope_interleaved:
        raise ValueError("export_peft: this model keeps llama2.c's interleaved RoPE rows, which Hugging Face "
                         "models do not; load it with keep_interleaved_rope=False to export")
    tensors = {}
    for target in lora.targets:
        (module, proj), _, _ = TARGETS[target]
        ab = adapters["layers"][module][proj]
        a, b = np.asarray(ab["lora_a"], np.float32), np.asarray(ab["lora_b"], np.float32)
        for i in range(config.num_layers):
            tensors[_peft_name(i, target, "A")] = np.ascontiguousarray(a[i].reshape(-1, lora.rank).T)
            tensors[_peft_name(i, target, "B")] = np.ascontiguousarray(b[i].reshape(lora.rank, -1).T)
    saved = None
    if "score" in adapters:  # a reward model's score head, trained beside the adapters: PEFT's modules_to_save
        tensors["base_model.model.score.weight"] = np.asarray(adapters["score"]["kernel"], np.float32)[None, :]
        saved = ["score"]
    peft_config = {
        "peft_type": "LORA", "task_type": "SEQ_CLS" if saved else "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "bias": "none",
        "target_modules": sorted(TARGETS[t][0][1] for t in lora.targets), "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "inference_mode": True, "init_lora_weights": True,
        "modules_to_save": saved, "layers_to_transform": None, "revision": None,
    }
    names = [PEFT_WEIGHTS, PEFT_CONFIG]  # the config last: a folder with it is complete
    with tempfile.TemporaryDirectory(prefix="rlax-peft-") as staging:
        save_file(tensors, str(Path(staging) / PEFT_WEIGHTS), metadata={"format": "pt"})
        (Path(staging) / PEFT_CONFIG).write_text(json.dumps(peft_config, indent=2) + "\n")
        storage = open_storage(str(destination))
        for name in names:
            with open(Path(staging) / name, "rb") as source, storage.writer(name) as target:
                shutil.copyfileobj(source, target, 1 << 24)
    return names


def read_peft_config(folder: str | os.PathLike) -> dict[str, Any]:
    with local_copy(f"{str(folder).rstrip('/')}/{PEFT_CONFIG}") as local:
        if not local.is_file():
            raise CheckpointError(f"{folder}: no {PEFT_CONFIG} (not a PEFT adapter folder)")
        return json.loads(local.read_text())


def load_peft(folder: str | os.PathLike, config: ModelConfig) -> tuple[LoraConfig, Any]:
    """The LoRA settings and stacked adapters (float32) of a PEFT folder for a model of ``config``."""
    from safetensors.numpy import load_file

    raw = read_peft_config(folder)
    by_module = {proj: target for target, ((_, proj), _, _) in TARGETS.items()}
    modules = raw.get("target_modules") or []
    unknown = [m for m in modules if m not in by_module]
    if raw.get("peft_type") != "LORA" or unknown or raw.get("use_dora") or raw.get("use_rslora"):
        raise CheckpointError(f"{folder}: only plain LoRA on {', '.join(by_module)} is supported "
                              f"(got peft_type={raw.get('peft_type')}, target_modules={modules})")
    lora = LoraConfig(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]),
                      targets=tuple(t for t in TARGETS if TARGETS[t][0][1] in modules))
    with local_copy(f"{str(folder).rstrip('/')}/{PEFT_WEIGHTS}") as local:
        tensors = load_file(str(local))
    layer: dict[str, Any] = {}
    for target, (a_shape, b_shape) in adapter_shapes(config, lora).items():
        (module, proj), _, _ = TARGETS[target]
        try:
            a = np.stack([tensors[_peft_name(i, target, "A")].T for i in range(config.num_layers)])
            b = np.stack([tensors[_peft_name(i, target, "B")].T for i in range(config.num_layers)])
        except KeyError as missing:
            raise CheckpointError(f"{folder}: {PEFT_WEIGHTS} has no {missing}") from None
        layer.setdefault(module, {})[proj] = {"lora_a": a.reshape(a_shape).astype(np.float32),
                                              "lora_b": b.reshape(b_shape).astype(np.float32)}
    return lora, {"layers": layer}
