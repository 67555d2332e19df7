"""Tokenizers against transformers' AutoTokenizer output (tests/fixtures/golden/qwen2_tokenizer.json)."""
import json

import pytest

from rlax_core.models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def golden(golden_dir):
    return json.loads((golden_dir / "qwen2_tokenizer.json").read_text())


@pytest.fixture(scope="module")
def qwen2(data_dir):
    return load_tokenizer(data_dir / "tokenizers/qwen2")


def test_qwen2_ids_and_decoded_text_of_every_case(qwen2, golden):
    for case in golden["cases"]:
        assert qwen2.encode(case["text"]) == case["ids"], case["text"]
        assert qwen2.decode(case["ids"]) == case["decoded"], case["text"]


def test_qwen2_special_token_ids(qwen2, golden):
    assert qwen2.special_tokens == golden["special_token_ids"]
    for token, token_id in golden["special_token_ids"].items():
        assert qwen2.token_to_id(token) == token_id
    assert (qwen2.eos_id, qwen2.pad_id, qwen2.bos_id) == (151645, 151643, None)
    assert qwen2.encode("hi", add_bos=True) == qwen2.encode("hi")  # Qwen has no BOS to add


def test_qwen2_chat_template_renders_like_transformers(qwen2, golden):
    chat = golden["chat_template"]
    text = qwen2.apply_chat_template(chat["messages"], add_generation_prompt=True)
    assert text == chat["text"]
    assert qwen2.apply_chat_template(chat["messages"], add_generation_prompt=True, tokenize=True) == chat["ids"]


def test_sentencepiece_tok512_matches_the_golden_prompt(golden_dir):
    import numpy as np

    golden = np.load(golden_dir / "stories260K/golden.npz")
    tok = load_tokenizer(golden_dir / "stories260K/tokenizer.model")
    assert tok.encode(str(golden["prompt_text"]), add_bos=True) == golden["prompt_ids"].tolist()
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, None)
    full = golden["prompt_ids"].tolist() + golden["prompt_greedy_new_ids"].tolist()
    assert tok.decode(full) == str(golden["prompt_text"]) + str(golden["prompt_greedy_text"])
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_unknown_tokenizer_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
