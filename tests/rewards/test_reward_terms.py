"""RewardConfig from YAML-like dicts, the registry, the built-in terms and their weighted sum."""

import json

import pytest

from rlax_core.config import ConfigError, apply_overrides, from_dict, to_dict
from rlax_core.data.records import make_example
from rlax_core.rewards import (REWARDS, RewardConfig, Rewarder, RewardResult, RewardTerm, Sample, register_reward,
                               reward_names)


def _math(answer: str) -> dict:
    return make_example(source="test", prompt=f"what is {answer}?", task="math", answer=answer)


def _code(tests) -> dict:
    return make_example(source="test", prompt="write f", task="code", tests=tests)


def test_config_from_dict_with_overrides_and_round_trip():
    data = apply_overrides({"terms": {"math": 1.0}}, ["terms.format_boxed=0.1", "math.timeout_seconds=3",
                                                      "code.limits.memory_bytes=536870912"])
    config = from_dict(RewardConfig, data, "rewards")
    assert config.terms == {"math": 1.0, "format_boxed": 0.1}
    assert config.math.timeout_seconds == 3.0 and config.code.limits.memory_bytes == 512 << 20
    assert from_dict(RewardConfig, to_dict(config)) == config


@pytest.mark.parametrize("data, path", [
    ({"terms": {"nope": 1.0}}, "rewards.terms.nope"),
    ({"terms": {}}, "rewards.terms"),
    ({"terms": {"math": float("nan")}}, "rewards.terms.math"),
    ({"terms": {"overlong": 1.0}}, "rewards.terms.overlong"),  # moved to algorithm.overlong_*
    ({"extraction": ["boxed", "guess"]}, "rewards.extraction"),
    ({"code": {"per_test_seconds": 100.0}}, "rewards.code.per_test_seconds"),
    ({"code": {"limits": {"processes": 0}}}, "rewards.code.limits.processes"),
    ({"math": {"timeout": 3}}, "rewards.math.timeout"),
    ({"overlong": {"max_length": 10, "cache_length": 20}}, "rewards.overlong"),
])
def test_bad_config_names_its_key(data, path):
    with pytest.raises(ConfigError) as error:
        from_dict(RewardConfig, data, "rewards")
    assert error.value.path == path


def test_registry_lists_builtins_and_takes_new_terms():
    assert {"math", "code", "task", "format_boxed", "format_think", "format_code_block"} <= set(reward_names())

    @register_reward("test_mentions_cat")
    class MentionsCat(RewardTerm):
        def score(self, sample):
            hit = "cat" in sample.completion
            return RewardResult(float(hit), {"pass": hit})

    try:
        with Rewarder(RewardConfig(terms={"test_mentions_cat": 2.0})) as rewarder:
            assert rewarder({}, "a cat").score == 2.0 and rewarder({}, "a dog").info["pass"] is False
        with pytest.raises(ValueError, match="already registered"):
            register_reward("math")(MentionsCat)
    finally:
        del REWARDS["test_mentions_cat"]


def test_math_and_code_by_task_with_format_and_weights():
    config = RewardConfig(terms={"task": 1.0, "format_boxed": 0.5})
    samples = [
        Sample(_math("1,234"), "Adding up, \\boxed{1234}."),
        Sample(_math("\\frac{1}{2}"), "Half is 0.5, so the answer is 0.5."),
        Sample(_math("7"), "\\boxed{8}"),
        Sample(_math("7"), "I cannot say."),
        Sample(_code(["assert f(2) == 4"]), "```python\ndef f(x):\n    return 2 * x\n```"),
        Sample(_code(["assert f(2) == 4"]), "```python\ndef f(x):\n    return x + 3\n```"),
    ]
    with Rewarder(config) as rewarder:
        results = rewarder.score_many(samples)
    assert [r.score for r in results] == [1.5, 1.0, 0.5, 0.0, 1.0, 0.0]
    assert [r.info["pass"] for r in results] == [True, True, False, False, True, False]
    assert results[1].info["terms"]["task"]["method"] == "answer_is"
    assert results[3].info["terms"]["task"]["reason"] == "no_answer"
    assert results[5].info["terms"]["task"]["verdicts"][0]["reason"] == "failed"
    json.dumps([r.info for r in results])  # reward_info must serialise


def test_code_partial_credit_and_humaneval_record(data_dir):
    row = json.loads((data_dir / "humaneval" / "HumanEval.jsonl").read_text().splitlines()[0])
    example = _code({k: row[k] for k in ("prompt", "test", "entry_point")})
    config = from_dict(RewardConfig, {"terms": {"code": 1.0}, "code": {"partial_credit": True, "workers": 1}})
    with Rewarder(config) as rewarder:
        assert rewarder(example, row["canonical_solution"]).score == 1.0
        half = rewarder(_code(["assert f(1) == 1", "assert f(2) == 1"]), "def f(x):\n    return 1 if x == 1 else 0\n")
    assert half.score == 0.5 and half.info["pass"] is False


def test_format_terms():
    config = RewardConfig(terms={"format_think": 1.0, "format_boxed": 1.0, "format_code_block": 1.0})
    with Rewarder(config) as rewarder:
        def scores(text):
            return {name: term["score"] for name, term in rewarder({}, text).info["terms"].items()}

        assert scores("<think>2+2 is 4</think> The answer is \\boxed{4}.") == {
            "format_think": 1.0, "format_boxed": 1.0, "format_code_block": 0.0}
        assert scores("<think></think>\\boxed{4}")["format_think"] == 0.0  # no reasoning
        assert scores("<think>a</think><think>b</think> 4")["format_think"] == 0.0  # two blocks
        assert scores("<think>a</think>")["format_think"] == 0.0  # no answer after it
        assert scores("\\boxed{1} or \\boxed{2}")["format_boxed"] == 0.0
        assert scores("\\boxed{}")["format_boxed"] == 0.0
        assert scores("```python\nprint(1)\n```")["format_code_block"] == 1.0


def test_the_overlong_term_moved_to_the_algorithm_and_says_so():
    for data in ({"terms": {"overlong": 1.0}}, {"overlong": {"max_length": 100}}):
        with pytest.raises(ConfigError, match="algorithm.overlong_max_length"):
            from_dict(RewardConfig, data, "rewards")


def test_missing_fields_and_unknown_tasks_are_clear_reasons_for_a_zero():
    with Rewarder(RewardConfig(terms={"task": 1.0})) as rewarder:
        no_answer = rewarder({"id": "x", "task": "math", "answer": None}, "\\boxed{1}")
        poetry = rewarder({"task": "poetry"}, "roses")
    assert no_answer.score == 0.0 and "has no 'answer'" in no_answer.info["scoring_error"]
    assert poetry.score == 0.0 and "got task 'poetry'" in poetry.info["scoring_error"]
