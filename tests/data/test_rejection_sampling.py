"""Rejection-sampling data: which verified samples become SFT rows, which pairs, and what each row records."""

import json

import pytest

from rlax_core.config import ConfigError
from rlax_core.data.records import PREFERENCE_PAIR_SCHEMA, SFT_EXAMPLE_SCHEMA, make_example, to_table
from rlax_core.data.rejection_sampling import (SKIPPED, UNSOLVED, Sample, SampleSelection, generator_name, pass_rate,
                                               preference_pairs, rejection_sampling_data, samples_of, select_verified)

EXAMPLE = make_example(source="gsm8k", prompt="What is 2 + 3?", task="math", answer="5")


def _result(texts, correct, lengths=None, skipped=None, example=EXAMPLE):
    lengths = lengths or [len(t.split()) for t in texts]
    return {"example": example, "model": "m", "texts": list(texts), "lengths": list(lengths),
            "finish_reasons": ["stop"] * len(texts), "correct": list(correct), "answers": [None] * len(texts),
            "skipped": skipped}


def _samples(texts, correct, lengths=None):
    return samples_of(_result(texts, correct, lengths))


TEXTS = ["a b c d e \\boxed{5}", "\\boxed{5}", "wrong \\boxed{4}", "x y \\boxed{5}", "no", "q r s t \\boxed{5}"]
CORRECT = [True, True, False, True, False, True]


def test_shortest_keeps_the_shortest_verified_samples_up_to_n():
    kept = select_verified(_samples(TEXTS, CORRECT), SampleSelection(max_per_prompt=2), EXAMPLE["id"])
    assert [s.text for s in kept] == ["\\boxed{5}", "x y \\boxed{5}"]
    everything = select_verified(_samples(TEXTS, CORRECT), SampleSelection(max_per_prompt=10), EXAMPLE["id"])
    assert [s.index for s in everything] == [1, 3, 5, 0]  # all four verified, no failed one, shortest first


def test_shortest_counts_tokens_then_characters_then_sample_index():
    samples = _samples(["bbbb", "aa", "cc", "d"], [True] * 4, lengths=[1, 2, 2, 3])
    assert [s.text for s in select_verified(samples, SampleSelection(max_per_prompt=4), "id")] == ["bbbb", "aa", "cc", "d"]


def test_random_is_reproducible_for_a_seed_and_an_example_whatever_the_order_given():
    samples = _samples([f"answer {i} \\boxed{{5}}" for i in range(12)], [True] * 12)
    rule = SampleSelection(max_per_prompt=4, selection="random", seed=3)
    first = [s.index for s in select_verified(samples, rule, "ex-1")]
    assert first == [s.index for s in select_verified(list(reversed(samples)), rule, "ex-1")]
    assert len(set(first)) == 4 and first != [0, 1, 2, 3]
    others = {tuple(s.index for s in select_verified(samples, SampleSelection(4, "random", seed), "ex-1"))
              for seed in range(5)}
    assert len(others) > 1  # the seed chooses
    assert first != [s.index for s in select_verified(samples, rule, "ex-2")] or \
        first != [s.index for s in select_verified(samples, rule, "ex-3")]  # so does the example


def test_duplicates_by_normalised_text_are_kept_once_and_empty_completions_not_at_all():
    texts = ["The answer is \\boxed{5}", "the  ANSWER is \\boxed{5}", "  ", "so \\boxed{5}", "the answer is \\boxed{5} "]
    kept = select_verified(_samples(texts, [True] * 5), SampleSelection(max_per_prompt=10), "id")
    assert sorted(s.index for s in kept) == [0, 3]
    data = rejection_sampling_data(_result(texts, [True] * 5), SampleSelection(max_per_prompt=10), "gen")
    assert len(data.sft) == 2 and data.duplicates == 3


def test_only_verified_samples_become_rows_and_each_records_pass_rate_generator_and_prompt():
    data = rejection_sampling_data(_result(TEXTS, CORRECT), SampleSelection(max_per_prompt=3), "Qwen2.5-7B-Instruct")
    assert data.reason is None and data.pass_rate == pass_rate(_samples(TEXTS, CORRECT)) == 4 / 6
    assert {row["completion"] for row in data.sft} <= {t for t, ok in zip(TEXTS, CORRECT) if ok}
    for row in data.sft:
        assert row["pass_rate"] == 4 / 6 and row["generator"] == "Qwen2.5-7B-Instruct"
        assert row["example_id"] == EXAMPLE["id"] and row["source"] == "gsm8k" and row["messages"] is None
        assert row["prompt"].startswith("What is 2 + 3?") and "\\boxed{}" in row["prompt"]  # the task's format
        meta = json.loads(row["meta"])
        assert meta["correct"] and meta["task"] == "math" and meta["chat"] and meta["selection"] == "shortest"
    assert len({row["id"] for row in data.sft}) == 3
    to_table(data.sft, SFT_EXAMPLE_SCHEMA)  # the schema the SFT job reads


def test_row_ids_are_stable_across_runs_and_differ_by_completion():
    first = rejection_sampling_data(_result(TEXTS, CORRECT), SampleSelection(max_per_prompt=3), "g")
    again = rejection_sampling_data(_result(TEXTS, CORRECT), SampleSelection(max_per_prompt=3), "g")
    assert [r["id"] for r in first.sft] == [r["id"] for r in again.sft]
    assert all(r["id"].startswith(EXAMPLE["id"] + "-") for r in first.sft)


def test_pairs_are_a_verified_sample_against_a_failed_one_of_the_same_prompt():
    data = rejection_sampling_data(_result(TEXTS, CORRECT), SampleSelection(max_per_prompt=0, pairs_per_prompt=8), "g")
    verified = {t for t, ok in zip(TEXTS, CORRECT) if ok}
    failed = {t for t, ok in zip(TEXTS, CORRECT) if not ok}
    assert data.sft == [] and len(data.pairs) == 8 == len({(p["chosen"], p["rejected"]) for p in data.pairs})
    for pair in data.pairs:
        assert pair["chosen"] in verified and pair["rejected"] in failed and pair["example_id"] == EXAMPLE["id"]
        assert pair["prompt"].startswith(EXAMPLE["prompt"]) and pair["pass_rate"] == 4 / 6
        meta = json.loads(pair["meta"])
        assert meta["chosen"]["correct"] and not meta["rejected"]["correct"]
    to_table(data.pairs, PREFERENCE_PAIR_SCHEMA)


def test_pairs_use_every_distinct_sample_once_before_any_twice_and_stop_at_the_cap():
    samples = _samples(TEXTS, CORRECT)  # 4 verified, 2 failed
    pairs = preference_pairs(samples, SampleSelection(max_per_prompt=1, pairs_per_prompt=4), "id")
    assert len({c.index for c, _ in pairs}) == 4 and {r.index for _, r in pairs} == {2, 4}
    assert len(preference_pairs(samples, SampleSelection(max_per_prompt=1, pairs_per_prompt=100), "id")) == 8  # 4 x 2
    assert len(preference_pairs(samples, SampleSelection(max_per_prompt=1, pairs_per_prompt=3), "id")) == 3


@pytest.mark.parametrize("verified, failed", [(1, 5), (3, 3), (5, 2), (4, 6)])
def test_the_pairs_walk_every_combination_exactly_once(verified, failed):
    texts = [f"right {i} \\boxed{{5}}" for i in range(verified)] + [f"wrong {i}" for i in range(failed)]
    samples = _samples(texts, [True] * verified + [False] * failed)
    pairs = [(c.index, r.index) for c, r in preference_pairs(samples, SampleSelection(1, pairs_per_prompt=99), "id")]
    assert sorted(pairs) == sorted((c, r) for c in range(verified) for r in range(verified, verified + failed))
    first = pairs[:max(verified, failed)]  # the larger side, each sample once
    assert len({c for c, _ in first} if verified >= failed else {r for _, r in first}) == max(verified, failed)


@pytest.mark.parametrize("correct", [[True] * 4, [False] * 4])
def test_no_pairs_when_every_sample_passed_or_every_one_failed(correct):
    texts = ["one \\boxed{5}", "two \\boxed{5}", "three \\boxed{5}", "four"]
    data = rejection_sampling_data(_result(texts, correct), SampleSelection(max_per_prompt=2, pairs_per_prompt=4), "g")
    assert data.pairs == []
    assert (data.reason, len(data.sft)) == ((None, 2) if correct[0] else (UNSOLVED, 0))


def test_a_failed_sample_with_a_verified_samples_text_is_no_pair():
    samples = _samples(["\\boxed{5}", "\\boxed{5} ", "other"], [True, False, False])
    pairs = preference_pairs(samples, SampleSelection(max_per_prompt=1, pairs_per_prompt=5), "id")
    assert [(c.index, r.index) for c, r in pairs] == [(0, 2)]


def test_a_skipped_or_unsolved_prompt_gives_no_rows_and_says_why():
    skipped = rejection_sampling_data(_result([], [], skipped="prompt of 90 tokens exceeds max_prompt_len=64"),
                                      SampleSelection(), "g")
    assert (skipped.reason, skipped.pass_rate, skipped.detail) == (SKIPPED, None, "prompt of 90 tokens exceeds max_prompt_len=64")
    unsolved = rejection_sampling_data(_result(["a", "b"], [False, False]), SampleSelection(pairs_per_prompt=2), "g")
    assert (unsolved.reason, unsolved.pass_rate, unsolved.sft, unsolved.pairs) == (UNSOLVED, 0.0, [], [])
    assert unsolved.detail == "none of 2 samples verified"


@pytest.mark.parametrize("kwargs, key", [({"max_per_prompt": -1}, "max_per_prompt"),
                                         ({"pairs_per_prompt": -2}, "pairs_per_prompt"),
                                         ({"max_per_prompt": 0, "pairs_per_prompt": 0}, "max_per_prompt"),
                                         ({"selection": "longest"}, "selection")])
def test_a_bad_selection_is_refused_by_its_key(kwargs, key):
    with pytest.raises(ConfigError) as caught:
        SampleSelection(**kwargs)
    assert caught.value.path == key


def test_the_generator_is_named_by_its_folder_or_its_version():
    assert generator_name("/models/Qwen2.5-7B-Instruct/") == "Qwen2.5-7B-Instruct"
    assert generator_name("gs://b/models/stories260K") == "stories260K"
    assert generator_name("weights:runs/x/weights@12") == "weights:runs/x/weights@12"
    assert generator_name("checkpoint:gs://b/ckpt@200") == "checkpoint:gs://b/ckpt@200"
    assert generator_name("/models/teacher", "my-teacher") == "my-teacher"


def test_a_sample_is_what_the_verifier_said():
    [sample] = samples_of({**_result(["t"], [True]), "answers": ["5"]})
    assert sample == Sample(index=0, text="t", tokens=1, finish_reason="stop", correct=True, answer="5")
