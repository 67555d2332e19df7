"""A complete Hugging Face model folder: weights, ``config.json``, tokenizer and ``generation_config.json``.

    export_hf("runs/x/hf/step_00000010", config, params, tokenizer_source="Qwen2.5-0.5B/",
              generation={"temperature": 1.0, "max_new_tokens": 512})

What transformers, vLLM and ``rlax generate`` / ``rlax evaluate`` need to load a model, in one call:
safetensors and ``config.json`` (``save_pretrained``), the tokenizer files copied from where the
model came from (a llama2.c SentencePiece ``tok512.model`` becomes ``tokenizer.model`` with a
``tokenizer_config.json`` naming its special tokens), and ``generation_config.json`` (BOS/EOS/PAD ids
and the sampling settings the policy was trained with). Without ``params`` it writes everything but
the weights: the *model template* a weight-store version or an orbax checkpoint is read with.

Files go through the weight store's storage (``rlax_core.utils.storage``), so a destination may be a
local folder or gs://. ``config.json`` is written last: a reader never takes a half-written folder
for a model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from rlax_core.models.checkpoint import Model, local_copy
from rlax_core.models.saving import save_pretrained
from rlax_core.models.config import ModelConfig

# Files of a Hugging Face tokenizer, copied as they are.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja", "tokenizer.model")
SENTENCEPIECE_FILE = "tokenizer.model"  # the name transformers' LlamaTokenizer looks for
GENERATION_CONFIG = "generation_config.json"
MODEL_CONFIG = "config.json"


def export_hf(destination: str | os.PathLike, config: ModelConfig, params: Any | None, *,
              tokenizer_source: str | os.PathLike, generation: Mapping[str, Any] | None = None,
              max_shard_size: int | str = "5GB") -> list[str]:
    """Write a Hugging Face folder at ``destination`` (local or gs://); returns the file names written.

    ``params`` None writes the model template only (config, tokenizer, generation settings).
    ``tokenizer_source`` is a tokenizer folder or file (a llama2.c ``.bin`` stands for its folder).
    ``generation`` adds sampling settings (``temperature``, ``top_p``, ``max_new_tokens``, ...) to the
    token ids ``generation_config.json`` always holds.
    """
    from rlax_core.utils.storage import open_storage

    with tempfile.TemporaryDirectory(prefix="rlax-export-") as staging:
        folder = Path(staging)
        if params is not None:
            save_pretrained(Model(config, params), folder, max_shard_size=max_shard_size)
        else:
            (folder / MODEL_CONFIG).write_text(json.dumps(config.to_hf(), indent=2) + "\n")
        _copy_tokenizer(str(tokenizer_source), folder, config)
        (folder / GENERATION_CONFIG).write_text(json.dumps(generation_config(config, generation), indent=2) + "\n")
        storage = open_storage(str(destination))
        names = sorted(p.name for p in folder.iterdir() if p.name != MODEL_CONFIG) + [MODEL_CONFIG]
        if params is not None:
            for stale in storage.list(""):  # a shard count that changed would leave old shards beside new ones
                if stale.endswith(".safetensors") and stale not in names:
                    storage.delete(stale)
        for name in names:
            with open(folder / name, "rb") as source, storage.writer(name) as target:
                shutil.copyfileobj(source, target, 1 << 24)
    return names


def generation_config(config: ModelConfig, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``generation_config.json``: the model's special token ids, then ``settings`` (which win)."""
    eos = list(config.eos_token_ids)
    out: dict[str, Any] = {"bos_token_id": config.bos_token_id,
                           "eos_token_id": eos if len(eos) > 1 else (eos[0] if eos else None),
                           "pad_token_id": config.pad_token_id}
    out = {k: v for k, v in out.items() if v is not None}
    out.update({k: v for k, v in (settings or {}).items() if v is not None})
    if "temperature" in out:
        out.setdefault("do_sample", out["temperature"] > 0)
    return out


def tokenizer_source_of(model_path: str) -> str:
    """Where a model's tokenizer lives: its folder (the folder holding a llama2.c ``.bin``)."""
    path = model_path.rstrip("/")
    return path.rsplit("/", 1)[0] if path.endswith(".bin") else path


def _copy_tokenizer(source: str, folder: Path, config: ModelConfig) -> None:
    with local_copy(tokenizer_source_of(source)) as local:
        directory = local if local.is_dir() else local.parent
        copied = []
        for name in TOKENIZER_FILES:
            if (directory / name).is_file():
                shutil.copyfile(directory / name, folder / name)
                copied.append(name)
        sentencepiece = [local] if local.is_file() and local.suffix == ".model" else sorted(directory.glob("*.model"))
        if SENTENCEPIECE_FILE not in copied and len(sentencepiece) == 1:
            shutil.copyfile(sentencepiece[0], folder / SENTENCEPIECE_FILE)
            copied.append(SENTENCEPIECE_FILE)
        if not copied:
            raise FileNotFoundError(f"{source}: no tokenizer files to export (tokenizer.json, vocab.json + merges.txt "
                                    "or a SentencePiece .model)")
    if SENTENCEPIECE_FILE in copied and "tokenizer_config.json" not in copied:
        (folder / "tokenizer_config.json").write_text(json.dumps(_sentencepiece_config(folder, config), indent=2) + "\n")


def _sentencepiece_config(folder: Path, config: ModelConfig) -> dict[str, Any]:
    """What transformers' LlamaTokenizer needs beside a bare SentencePiece model (llama2.c's tok512)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / SENTENCEPIECE_FILE))

    def piece(token_id: int | None) -> str | None:
        return processor.id_to_piece(token_id) if token_id is not None and token_id >= 0 else None

    return {"tokenizer_class": "LlamaTokenizer", "model_max_length": config.max_position_embeddings,
            "bos_token": piece(processor.bos_id()), "eos_token": piece(processor.eos_id()),
            "unk_token": piece(processor.unk_id()), "pad_token": piece(processor.pad_id()),
            "add_bos_token": processor.bos_id() >= 0, "add_eos_token": False, "legacy": True}
