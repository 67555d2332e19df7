"""The learned reward terms: ``reward_model`` (a sequence-classification model) and ``judge`` (an LLM
judge on the engine), with stories260K as both the reward model's backbone and the judge."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from rlax_core.config import ConfigError, from_dict
from rlax_core.models import from_pretrained
from rlax_core.models.checkpoint import Model
from rlax_core.models.export import export_hf
from rlax_core.rewards import RewardConfig, Rewarder, RewardUnavailable, Sample
from rlax_core.rewards.judge import (Judge, bradley_terry_strengths, fill_template, parse_score, parse_verdict,
                                     win_rates)
from rlax_core.rewards.reward_model import render_for_reward_model
from rlax_core.training.reward_model import (init_reward_params, reward_model_config, sequence_scores,
                                             write_score_stats)

STORIES = Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K"
EXAMPLE = {"id": "e1", "task": "story", "prompt": "Once upon a time, Lily", "answer": "a cat"}


@pytest.fixture(scope="module")
def reward_model_folder(tmp_path_factory):
    policy = from_pretrained(STORIES / "stories260K.bin")
    config = reward_model_config(policy.config)
    params = init_reward_params(policy.params)
    params["score"]["kernel"] = jax.random.normal(jax.random.key(0), params["score"]["kernel"].shape)
    folder = tmp_path_factory.mktemp("rm")
    export_hf(folder, config, params, tokenizer_source=STORIES / "tok512.model")
    write_score_stats(folder, {"score_mean": 0.5, "score_std": 2.0})
    return folder, config, params


def _rewards(**sections):
    return from_dict(RewardConfig, {"terms": {name: 1.0 for name in sections}, **sections})


def test_the_reward_model_term_scores_prompt_and_completion_normalised_by_the_saved_stats(reward_model_folder):
    folder, config, params = reward_model_folder
    completions = [" went to the park.", " saw a big dog and ran home to her mom."]
    with Rewarder(_rewards(reward_model={"path": str(folder)})) as rewarder:
        results = rewarder.score_many([Sample(EXAMPLE, text) for text in completions])
        tokenizer = rewarder.terms["reward_model"].tokenizer
    for text, (reward, info) in zip(completions, results):
        rendered, add_bos = render_for_reward_model(EXAMPLE, text, tokenizer)
        assert rendered == EXAMPLE["prompt"] + text and add_bos  # stories260K has no chat template
        ids = np.asarray([tokenizer.encode(rendered, add_bos=True)])
        raw = float(jax.jit(sequence_scores, static_argnames="config")(params, config, ids, np.ones_like(ids))[0])
        np.testing.assert_allclose(info["terms"]["reward_model"]["raw_score"], raw, atol=1e-4)
        np.testing.assert_allclose(reward, (raw - 0.5) / 2.0, atol=1e-4)


def test_calibration_normalises_by_the_first_scores(reward_model_folder):
    folder, _, _ = reward_model_folder
    texts = [" ran.", " sat on a mat.", " had a red ball.", " was sad."]
    settings = {"path": str(folder), "normalize": "calibrate", "calibration_samples": 4}
    with Rewarder(_rewards(reward_model=settings)) as rewarder:
        results = rewarder.score_many([Sample(EXAMPLE, text) for text in texts])
        frozen = rewarder.terms["reward_model"].stats
    raw = np.array([info["terms"]["reward_model"]["raw_score"] for _, info in results])
    assert frozen == pytest.approx({"mean": raw.mean(), "std": raw.std()})
    np.testing.assert_allclose([reward for reward, _ in results], (raw - raw.mean()) / raw.std(), atol=1e-5)


def test_a_sample_that_cannot_be_rendered_fails_alone_and_named(reward_model_folder):
    folder, _, _ = reward_model_folder
    broken = {"id": "no-task", "prompt": "Tom"}
    with Rewarder(_rewards(reward_model={"path": str(folder)})) as rewarder:
        good, bad = rewarder.score_many([Sample(EXAMPLE, " ran."), Sample(broken, " ran.")])
        assert rewarder.failures["reward_model"] == 1
    assert "scoring_error" not in good[1]
    assert bad[0] == 0.0 and "example 'no-task'" in bad[1]["scoring_error"]


def test_a_reward_model_whose_tokenizer_cannot_encode_the_policy_text_is_refused_in_one_line(
        reward_model_folder, tmp_path):
    # A word-level tokenizer that knows three words: the policy's other text becomes its unknown token.
    tokenizers = pytest.importorskip("tokenizers")
    folder, _, _ = reward_model_folder
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "Once": 3, "upon": 4, "a": 5},
                                                             unk_token="[UNK]"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"unk_token": "[UNK]"}))
    with Rewarder(_rewards(reward_model={"path": str(folder), "tokenizer": str(tmp_path)})) as rewarder:
        with pytest.raises(RewardUnavailable, match="its tokenizer cannot encode the policy's text") as caught:
            rewarder.score_many([Sample(EXAMPLE, " went to the park.")])
    assert "\n" not in str(caught.value)


def test_a_causal_language_model_is_no_reward_model(tmp_path):
    policy = from_pretrained(STORIES / "stories260K.bin")
    export_hf(tmp_path, policy.config, policy.params, tokenizer_source=STORIES / "tok512.model")
    with pytest.raises(RewardUnavailable, match="a causal language model, not a reward model"):
        Rewarder(_rewards(reward_model={"path": str(tmp_path), "normalize": "none"}))


# ----------------------------------------------------------------------------- the judge


def test_the_judge_template_is_filled():
    template = "Q: {question}\nRef: {reference}\nA: {completion}\nScore:"
    assert fill_template(template, EXAMPLE, completion=" ran.") == "Q: Once upon a time, Lily\nRef: a cat\nA:  ran.\nScore:"
    assert fill_template(template, {"prompt": "Hi"}, completion="yo") == "Q: Hi\nRef: \nA: yo\nScore:"
    pairwise = "{question}\nA: {completion_a}\nB: {completion_b}\nBetter:"
    assert fill_template(pairwise, EXAMPLE, completion_a="x", completion_b="y").endswith("A: x\nB: y\nBetter:")


@pytest.mark.parametrize("section, message", [
    ({"template": "Rate {question}:"}, "judge.template: has no {completion} placeholder"),
    ({"mode": "pairwise", "template": "{question} {completion_a}"}, "judge.template: has no {completion_b} placeholder"),
    ({"template": "{completion} {answer}"}, "unknown placeholder"),
    ({"score_pattern": r"\d+"}, "needs to be a regular expression with a capturing group"),
    ({"verdict_pattern": "(A"}, "needs to be a regular expression"),
])
def test_a_bad_judge_template_is_refused_in_one_line(section, message):
    with pytest.raises(ConfigError, match=message) as caught:
        _rewards(judge={"path": "unused", **section})
    assert "\n" not in str(caught.value)


def test_scores_and_verdicts_are_parsed_or_none():
    assert parse_score("I would say 7 out of 10.", r"(-?\d+(?:\.\d+)?)", 10.0) == 0.7
    assert parse_score("Score: 8.5", r"Score:\s*(\d+(?:\.\d+)?)", 10.0) == 0.85
    assert parse_score("no number here", r"(\d+)", 10.0) is None
    assert parse_verdict("Answer B is better.", r"\b([AB])\b") == "B"
    assert parse_verdict("both are fine", r"\b([AB])\b") is None


def test_pairwise_aggregation_of_a_known_comparison_matrix_ranks_as_expected():
    # 0 beats everyone, 1 beats 2 and 3, 2 beats 3: the order 0 > 1 > 2 > 3, twice each (both orders).
    wins = np.zeros((4, 4))
    for winner in range(4):
        for loser in range(winner + 1, 4):
            wins[winner, loser] = 2.0
    np.testing.assert_allclose(win_rates(wins), [1.0, 2 / 3, 1 / 3, 0.0])
    strengths = bradley_terry_strengths(wins)
    assert list(np.argsort(-strengths)) == [0, 1, 2, 3] and abs(strengths.sum()) < 1e-9
    # A cycle (0 > 1 > 2 > 0) is a three-way tie in both.
    cycle = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], float)
    np.testing.assert_allclose(win_rates(cycle), [0.5] * 3)
    np.testing.assert_allclose(bradley_terry_strengths(cycle), [0.0] * 3, atol=1e-9)


@pytest.fixture(scope="module")
def story_judge():
    # stories260K tells stories; it never writes a score: every answer is a parse failure.
    config = _rewards(judge={"path": str(STORIES / "stories260K.bin"), "template": "{question}{completion}",
                             "score_pattern": r"Score: (\d+)", "default_score": 0.25, "max_new_tokens": 12,
                             "max_prompt_len": 64, "num_slots": 4})
    judge = Judge(config)
    yield judge, config
    judge.close()


def test_the_judge_runs_on_the_engine_its_text_reaches_reward_info_and_failures_are_counted(story_judge):
    judge, config = story_judge
    samples = [Sample(EXAMPLE, " went to the park."), Sample(EXAMPLE, " had a dog.")]
    before = judge.parse_failures
    results = judge.score_many(samples)
    expected = judge.judge_prompts([EXAMPLE["prompt"] + s.completion for s in samples])
    assert [info["judge_text"] for _, info in results] == expected and all(expected)
    assert [reward for reward, _ in results] == [0.25, 0.25]
    assert [info["judge_parsed"] for _, info in results] == [False, False]
    assert judge.parse_failures - before == 2


def test_the_pairwise_judge_compares_the_samples_of_one_group(story_judge):
    judge, _ = story_judge
    settings = judge.settings
    import dataclasses

    judge.settings = dataclasses.replace(settings, mode="pairwise", template="{question}: {completion_a} or "
                                         "{completion_b}?", verdict_pattern=r"\b(A|B)\b")
    try:
        other = {**EXAMPLE, "id": "e2", "prompt": "Tom had a"}
        samples = [Sample(EXAMPLE, " ran."), Sample(EXAMPLE, " sat."), Sample(EXAMPLE, " hid."), Sample(other, " box.")]
        results = judge.score_many(samples)
    finally:
        judge.settings = settings
    # The group of three: 3 pairs asked in both orders; the lone sample is compared with none.
    assert [info["judge_comparisons"] for _, info in results] == [4, 4, 4, 0]
    assert sum(reward for reward, _ in results[:3]) == pytest.approx(1.5)  # win rates of a group share the wins
    assert results[3][0] == 0.5 and all(info["judge_text"] for _, info in results[:3])


def test_a_reward_model_without_saved_stats_is_refused_under_normalize_saved(tmp_path):
    policy = from_pretrained(STORIES / "stories260K.bin")
    config = reward_model_config(policy.config)
    export_hf(tmp_path, config, init_reward_params(policy.params), tokenizer_source=STORIES / "tok512.model")
    with pytest.raises(RewardUnavailable, match="no saved score statistics") as caught:
        Rewarder(_rewards(reward_model={"path": str(tmp_path)}))
    assert "\n" not in str(caught.value)


def test_the_configurations_on_the_reward_models_page_load():
    import re

    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "reward_models.md").read_text()
    blocks = [yaml.safe_load(body)["rewards"] for body in re.findall(r"^```yaml\n(.*?)^```", page, re.S | re.M)]
    assert len(blocks) == 3
    for block in blocks:
        config = from_dict(RewardConfig, block)
        assert set(config.terms) & {"reward_model", "judge"}
    assert "{completion}" in from_dict(RewardConfig, blocks[1]).judge.template


def test_rewarders_of_one_process_share_one_copy_of_the_reward_model(reward_model_folder):
    # A Beam worker builds a Rewarder per DoFn instance (per thread): the weights are held once.
    folder, _, _ = reward_model_folder
    with Rewarder(_rewards(reward_model={"path": str(folder)})) as first, \
            Rewarder(_rewards(reward_model={"path": str(folder), "normalize": "none"})) as second:
        assert first.terms["reward_model"].params is second.terms["reward_model"].params
        assert first.terms["reward_model"]._forward is second.terms["reward_model"]._forward
