"""Checkpoints for pipeline tests: a random-init toy Qwen2 saved with the real Qwen2 tokenizer."""

import shutil
from pathlib import Path

import jax

from rlax_core.models import Model, init_params, save_pretrained, toy_config

QWEN2_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json",
                         "special_tokens_map.json")


def toy_qwen2_checkpoint(folder: Path, data_dir: Path, seed: int = 0) -> Path:
    """A 2-layer Qwen2-shaped model over the real 151,936-entry Qwen2 vocabulary, in Hugging Face layout."""
    config = toy_config(vocab_size=151936, bos_token_id=None, eos_token_ids=(151645, 151643), pad_token_id=151643)
    save_pretrained(Model(config, init_params(config, jax.random.key(seed))), folder)
    for name in QWEN2_TOKENIZER_FILES:
        source = data_dir / "tokenizers/qwen2" / name
        if source.exists():
            shutil.copy(source, folder / name)
    return folder
