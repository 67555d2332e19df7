"""Shared engine fixtures: compiling is the slow part, so tests reuse one engine per configuration."""

import pytest

from rlax_core.inference.config import EngineConfig


@pytest.fixture(scope="session")
def stories(stories260k_dir):
    """The real stories260K model (llama2.c checkpoint) and its tokenizer."""
    from rlax_core.models import from_pretrained
    from rlax_core.models.tokenizer import load_tokenizer

    folder = stories260k_dir
    return from_pretrained(folder), load_tokenizer(folder)


@pytest.fixture(scope="session")
def small_engine_config():
    """Four slots, 8-token pages, prompts up to 32 tokens: every engine test fits in it."""
    return EngineConfig(num_slots=4, page_size=8, num_pages=96, max_prompt_len=32, max_new_tokens=256,
                            prefill_buckets=(8, 16, 32), decode_steps_per_call=16, attention_impl="window")
