"""Hugging Face checkpoints out: ``config.json`` and safetensors, sharded by size, local or gs://.

The names and ``[out, in]`` layouts come from the one table in ``checkpoint`` (``hf_state_items``),
which loading reads the other way."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from rlax_core.models.checkpoint import SAFETENSORS_INDEX, SAFETENSORS_SINGLE, Model, hf_state_items
from rlax_core.utils.paths import is_remote


def parse_size(size: int | str) -> int:
    """Bytes from 5000000, "5GB", "500MB", "2GiB"."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", size, re.IGNORECASE)
    if not match:
        raise ValueError(f"max_shard_size: cannot read {size!r}; write e.g. 5GB, 500MB or a byte count")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(number * scale)


def save_pretrained(model: Model, path: str | os.PathLike, max_shard_size: int | str = "5GB") -> list[str]:
    """Write ``config.json`` and safetensors in Hugging Face names and ``[out, in]`` layouts.

    One ``model.safetensors`` when everything fits in ``max_shard_size``; otherwise
    ``model-0000k-of-0000n.safetensors`` shards and ``model.safetensors.index.json``. A tied model
    stores no ``lm_head.weight``. Returns the file names written. ``path`` may be gs://.
    """
    config, limit = model.config, parse_size(max_shard_size)
    items = list(hf_state_items(config, model.params))
    shards: list[list[tuple[str, Callable[[], np.ndarray], int]]] = [[]]
    shard_bytes = 0
    for item in items:
        if shards[-1] and shard_bytes + item[2] > limit:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(item)
        shard_bytes += item[2]
    if len(shards) == 1:
        names = [SAFETENSORS_SINGLE]
    else:
        names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]

    remote = is_remote(path)
    with tempfile.TemporaryDirectory(prefix="rlax-save-") if remote else contextlib.nullcontext(str(path)) as out:
        out = Path(str(out).removeprefix("file://"))
        out.mkdir(parents=True, exist_ok=True)
        hf_config = config.to_hf()
        hf_config["torch_dtype"] = np.dtype(model.dtype).name
        (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        from safetensors.numpy import save_file

        weight_map = {}
        for shard, file in zip(shards, names):
            # One shard in host memory at a time.
            save_file({name: produce() for name, produce, _ in shard}, out / file, metadata={"format": "pt"})
            weight_map.update({name: file for name, _, _ in shard})
        written = ["config.json", *names]
        (out / SAFETENSORS_INDEX).unlink(missing_ok=True)  # a stale index would shadow a single file
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(item[2] for item in items)}, "weight_map": weight_map}
            (out / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
            written.append(SAFETENSORS_INDEX)
        if remote:
            from rlax_core.utils.storage import open_storage

            storage = open_storage(str(path))
            for file in written:
                with open(out / file, "rb") as source, storage.writer(file) as target:
                    shutil.copyfileobj(source, target, 1 << 24)
    return written
