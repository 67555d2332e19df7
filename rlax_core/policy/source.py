"""Where a policy to sample or evaluate comes from: a model folder, a weight-store version or a checkpoint.

    load_policy("runs/x/hf/step_00000010")               # Hugging Face folder (or llama2.c .bin, gs://)
    load_policy("weights:runs/x/weights@12")             # weight version 12 of a weight store
    load_policy("weights:gs://bucket/run/weights")       # its newest committed version
    load_policy("checkpoint:runs/x/checkpoints@10")      # the params of orbax checkpoint 10
    load_policy("runs/x/checkpoints")                    # detected: the newest checkpoint
    load_policy("runs/x/peft/step_00000010")             # a PEFT LoRA folder, merged into its base model

Without a prefix, a folder holding ``committed/`` is a weight store, a folder of numbered orbax
checkpoints is a checkpoint folder and a folder with ``adapter_config.json`` is a PEFT adapter
(merged into the model its ``base_model_name_or_path`` names); anything else goes to
``from_pretrained``. A LoRA run's weight versions are adapter-only: they load merged into their base
version (``rlax_core.weights.adapters``); its checkpoints hold adapters only, so evaluate its versions
or exports instead. Versions and
checkpoints hold parameters only: the architecture, tokenizer and generation settings come from the
*model template* ``rlax train`` writes beside them (``WEIGHTS/model/``, ``CHECKPOINTS/model/``: an
exported Hugging Face folder without weights, ``rlax_core.models.export``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Literal

from rlax_core.models.checkpoint import CheckpointError, Model, from_pretrained, local_copy
from rlax_core.models.config import ModelConfig

MODEL_TEMPLATE = "model"  # the sub-folder holding the model template, in a weight store and a checkpoint folder
PREFIXES = ("weights", "checkpoint", "adapter")

_VERSIONED = re.compile(r"^(?P<path>.+?)(?:@(?P<version>\d+))?$")


@dataclasses.dataclass(frozen=True)
class PolicySource:
    kind: Literal["model", "weights", "checkpoint", "adapter"]
    path: str  # the model folder / file, the weight store's root, the checkpoint folder, or the PEFT folder
    version: int | None = None  # weights / checkpoint: None is the newest

    @property
    def template(self) -> str:
        """The folder holding this policy's config.json and tokenizer."""
        if self.kind == "adapter":
            from rlax_core.models.lora_export import read_peft_config

            base = read_peft_config(self.path).get("base_model_name_or_path")
            if not base:
                raise CheckpointError(f"{self.path}: adapter_config.json names no base_model_name_or_path")
            return base
        return self.path if self.kind == "model" else f"{self.path.rstrip('/')}/{MODEL_TEMPLATE}"


def parse_policy_source(spec: str) -> PolicySource:
    """``weights:ROOT[@V]``, ``checkpoint:DIR[@STEP]``, or a path (a weight store or checkpoint folder is detected)."""
    prefix, _, rest = spec.partition(":")
    if prefix in PREFIXES and rest and not rest.startswith("//"):
        match = _VERSIONED.match(rest)
        version = match.group("version")
        return PolicySource(prefix, match.group("path"), None if version is None else int(version))
    path = spec.rstrip("/")
    if _exists(f"{path}/committed"):
        return PolicySource("weights", path)
    if _is_checkpoint_folder(path):
        return PolicySource("checkpoint", path)
    if _exists(f"{path}/adapter_config.json"):
        return PolicySource("adapter", path)
    return PolicySource("model", spec)


def tokenizer_path(spec: str) -> str:
    """The folder (or file) to load the policy's tokenizer from."""
    from rlax_core.models.export import tokenizer_source_of

    return tokenizer_source_of(parse_policy_source(spec).template)


def check_policy(spec: str) -> PolicySource:
    """Resolve ``spec`` without loading any parameters, or raise ``CheckpointError`` naming what is missing:
    a weight store's model template and the version asked for (else some committed version), a
    checkpoint folder's template and the step asked for (else some step). A plain model path is
    only parsed: ``from_pretrained`` says what a folder lacks."""
    source = parse_policy_source(spec)
    if source.kind == "model":
        return source
    if not _exists(f"{source.template}/config.json"):
        raise CheckpointError(f"{spec}: no model template {source.template}/config.json (rlax train writes it "
                              "beside the weight versions and checkpoints it makes)")
    if source.kind == "weights":
        import fsspec

        from rlax_core.weights.manifest import parse_version_name

        fs, root = fsspec.core.url_to_fs(f"{source.path.rstrip('/')}/committed")
        names = [n.rstrip("/").rsplit("/", 1)[-1] for n in (fs.ls(root, detail=False) if fs.isdir(root) else [])]
        available = sorted(v for v in map(parse_version_name, names) if v is not None)
        what = "committed weight version"
    else:
        available = _checkpoint_steps(source.path)
        what = "complete checkpoint"
    if not available or (source.version is not None and source.version not in available):
        asked = "" if source.version is None else f" {source.version}"
        raise CheckpointError(f"{spec}: no {what}{asked}; there are: {', '.join(map(str, available)) or 'none'}")
    return source


def load_policy(spec: str, dtype="float32") -> Model:
    """The model ``spec`` names (see the module docstring), its params cast to ``dtype``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    source = parse_policy_source(spec)
    if source.kind == "model":
        return from_pretrained(source.path, dtype=dtype)
    if source.kind == "adapter":
        from rlax_core.models.lora import merge
        from rlax_core.models.lora_export import load_peft

        base = from_pretrained(source.template, dtype="float32")
        lora, adapters = load_peft(source.path, base.config)
        params = jax.jit(merge, static_argnums=2)(base.params, adapters, lora)
        return Model(base.config, jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params))
    config = _template_config(source)
    params = _weight_version(source) if source.kind == "weights" else _checkpoint_params(source)
    cast = jnp.dtype(dtype)
    return Model(config, jax.tree.map(lambda x: jnp.asarray(np.asarray(x), cast), params))


def _template_config(source: PolicySource) -> ModelConfig:
    with local_copy(f"{source.template}/config.json") as local:
        if not local.is_file():
            raise CheckpointError(f"{source.path}: no model template {source.template}/config.json (rlax train writes "
                                  "it beside the weight versions and checkpoints it makes)")
        return ModelConfig.from_hf(json.loads(local.read_text()))


def _weight_version(source: PolicySource):
    from rlax_core.weights import WeightStore, WeightStoreConfig
    from rlax_core.weights.manifest import CommitMarker, marker_path
    from rlax_core.utils.storage import open_storage

    storage = open_storage(source.path)
    committed = sorted(n for n in storage.list("committed") if n.endswith(".json"))
    if not committed:
        raise CheckpointError(f"weights:{source.path}: no committed weight version")
    name = committed[-1] if source.version is None else marker_path(source.version).split("/", 1)[1]
    try:
        marker = CommitMarker.from_json(storage.read(f"committed/{name}"), where=f"{source.path}/committed/{name}")
    except FileNotFoundError:
        raise CheckpointError(f"weights:{source.path}: version {source.version} is not committed; committed: "
                              f"{', '.join(str(int(n[5:13])) for n in committed)}") from None
    from rlax_core.weights.adapters import load_version

    with WeightStore(WeightStoreConfig(root=source.path, run_id=marker.run_id)) as store:
        version = source.version if source.version is not None else store.latest()
        return load_version(store, version, as_numpy=True)[0]


def _checkpoint_params(source: PolicySource):
    from rlax_core.training.checkpoint import Checkpointer

    checkpointer = Checkpointer(source.path, async_save=False)
    try:
        steps = checkpointer.all_steps()
        step = source.version if source.version is not None else (steps[-1] if steps else None)
        if step not in steps:
            raise CheckpointError(f"checkpoint:{source.path}: no checkpoint {'' if step is None else step}; "
                                  f"complete checkpoints: {', '.join(map(str, steps)) or 'none'}")
        state, _ = checkpointer.restore(step)
    finally:
        checkpointer.close()
    return state["params"] if isinstance(state, dict) else state.params


def _exists(path: str) -> bool:
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    return fs.exists(root)


def _is_checkpoint_folder(path: str) -> bool:
    """A folder of rlax checkpoints: numbered sub-folders, sealed."""
    return bool(_checkpoint_steps(path))


def _checkpoint_steps(path: str) -> list[int]:
    """The numbered sub-folders of ``path`` that hold a sealed checkpoint (``Checkpointer.all_steps``), in order."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if not fs.isdir(root):
        return []
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
    numbered = [n for n in names if n.isdigit()]
    if not numbered:
        return []
    from rlax_core.training.checkpoint_integrity import SEAL_NAME

    return sorted(int(n) for n in numbered if fs.exists(f"{root.rstrip('/')}/{n}/{SEAL_NAME}"))
