"""stories260K and one small engine shared by the episode tests (compiling is the slow part)."""

import pytest

from rlax_core.inference.config import EngineConfig


@pytest.fixture(scope="session")
def stories(stories260k_dir):
    from rlax_core.models import from_pretrained
    from rlax_core.models.tokenizer import load_tokenizer

    return from_pretrained(stories260k_dir), load_tokenizer(stories260k_dir)


@pytest.fixture(scope="module")
def engine(stories):
    from rlax_core.inference.engine import Engine

    model, tokenizer = stories
    config = EngineConfig(num_slots=4, page_size=8, num_pages=160, max_prompt_len=64, max_new_tokens=192,
                          prefill_buckets=(16, 32, 64), decode_steps_per_call=8, attention_impl="window")
    return Engine(config, model.config, model.params, detokenize=tokenizer.decode)
