"""The model-free rules under the curate transforms: adapters, reference answers, fingerprints."""

import json

import pytest

from rlax_core.data.formats import FormatError, FieldMapping, detect_format, to_example
from rlax_core.data.answers import AnswerError, gsm8k_answer, last_boxed, plain_answer
from rlax_core.data.dedup import estimated_jaccard, exact_key, lsh_params, minhash_signature, ngram_hashes


def test_reference_answers():
    assert gsm8k_answer("She pays 2 * 500 = 1,000.\n#### 1,000") == "1000"
    assert last_boxed(r"so $\boxed{\frac{1}{2}}$ and finally $\boxed{\{1, 2\}}$") == r"\{1, 2\}"
    assert (plain_answer(27.0), plain_answer("025"), plain_answer(7)) == ("27", "25", "7")
    for bad in ("no marker", "#### twelve"):
        with pytest.raises(AnswerError):
            gsm8k_answer(bad)
    with pytest.raises(AnswerError):
        last_boxed(r"\boxed{}")


def test_every_fixture_dataset_row_adapts(data_dir):
    counts = {}
    for path in ("gsm8k/test.jsonl", "math/math500_test.jsonl", "aime24/test.jsonl", "aime25/test.jsonl",
                 "amc23/test.jsonl", "humaneval/HumanEval.jsonl", "mbpp/mbpp.jsonl"):
        rows = [to_example("auto", json.loads(line)) for line in (data_dir / path).read_text().splitlines()]
        counts[path.split("/")[0]] = (len(rows), rows[0]["task"])
    assert counts == {"gsm8k": (300, "math"), "math": (200, "math"), "aime24": (30, "math"), "aime25": (30, "math"),
                      "amc23": (40, "math"), "humaneval": (164, "code"), "mbpp": (974, "code")}


def test_generic_mapping_and_errors():
    row = to_example("generic", {"q": "What is 1+1?", "final": "#### 2", "topic": "add"}, source="mine",
                     mapping=FieldMapping(prompt="q", answer="final", answer_format="gsm8k", meta_fields=("topic",)))
    assert (row["source"], row["answer"], json.loads(row["meta"])) == ("mine", "2", {"topic": "add"})
    with pytest.raises(FormatError, match="missing_field"):
        to_example("gsm8k", {"question": "?"})
    with pytest.raises(FormatError, match="unknown_format"):
        detect_format({"foo": 1})


def test_fingerprints():
    assert exact_key("What is  2+2?") == exact_key("what is 2+2?") != exact_key("What is 2+3?")
    text = "a farmer has seventeen sheep and buys five more every week for six weeks then sells half"
    a = minhash_signature(text, num_perm=128, shingle_size=3)
    b = minhash_signature(text.replace("half", "a third"), num_perm=128, shingle_size=3)
    c = minhash_signature("compute the determinant of the given three by three matrix now", num_perm=128, shingle_size=3)
    assert estimated_jaccard(a, b) > 0.6 > 0.1 > estimated_jaccard(a, c)
    assert lsh_params(1.0, 128) == (1, 128)
    assert len(ngram_hashes(text, 13)) == 17 - 13 + 1 and len(ngram_hashes("short text", 13)) == 1
