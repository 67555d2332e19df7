"""Reward hacking is visible: a learned reward's mean and its correlation with the verifier's pass,
in every step's rollout metrics."""

import json

import numpy as np
import pytest

from rlax_core.rollout.metrics import group_summary, pearson, step_metrics


def _group(slot, scores, passes, learned="reward_model"):
    rows = []
    for score, passed in zip(scores, passes):
        terms = {"task": {"score": float(passed), "pass": passed}}
        if learned:
            terms[learned] = {"score": score, "raw_score": score}
            if learned == "judge":
                terms[learned]["judge_parsed"] = score > 0.5
        rows.append({"reward": score, "reward_info": json.dumps({"pass": passed, "terms": terms}),
                     "completion_ids": [1, 2, 3], "policy_version": 4})
    return {"key": (7, slot), "rows": rows, "generate_seconds": 1.0, "worker": "w"}


def test_a_learned_reward_beside_a_verifier_logs_its_mean_and_its_correlation_with_pass():
    groups = [_group(0, [2.0, -1.0, 0.5], [True, False, True]), _group(1, [1.5, 3.0, -2.0], [False, True, False])]
    row = step_metrics(7, [group_summary(g, written=True) for g in groups])
    scores = np.array([2.0, -1.0, 0.5, 1.5, 3.0, -2.0])
    passes = np.array([1, 0, 1, 0, 1, 0], float)
    assert row["reward_model_mean"] == pytest.approx(scores.mean())
    assert row["reward_model_pass_correlation"] == pytest.approx(np.corrcoef(scores, passes)[0, 1])
    assert row["pass_rate"] == 0.5


def test_a_hacked_reward_shows_as_a_correlation_near_zero_or_below():
    # The learned score rises where the verifier fails: the correlation is negative.
    row = step_metrics(1, [group_summary(_group(0, [3.0, 2.5, 0.1, 0.0], [False, False, True, True]),
                                         written=True)])
    assert row["reward_model_pass_correlation"] < -0.9


def test_without_a_learned_reward_nothing_is_added_and_constant_sides_have_no_correlation():
    row = step_metrics(1, [group_summary(_group(0, [1.0, 0.0], [True, False], learned=None), written=True)])
    assert not any(key.startswith(("reward_model", "judge")) for key in row)
    judged = step_metrics(1, [group_summary(_group(0, [0.2, 0.9], [True, True], learned="judge"), written=True)])
    assert judged["judge_mean"] == pytest.approx(0.55) and judged["judge_pass_correlation"] is None
    assert judged["judge_parse_failures"] == 1  # the 0.2 was the default of an answer that did not parse
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
