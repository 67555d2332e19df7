"""DAPO's dynamic sampling rule and overlong reward shaping (the stream applies both: tests/rollout/test_groups.py)."""

import numpy as np
import pytest

from rlax_core import rl


def test_a_group_is_informative_when_its_task_rewards_differ():
    assert not rl.is_informative([1.0, 1.0, 1.0]) and not rl.is_informative([0.0, 0.0])  # all right, all wrong
    assert rl.is_informative([0.0, 1.0]) and rl.is_informative([0.5, 0.0])
    assert not rl.has_reward_variance([1.0]) and rl.has_reward_variance([1.0, 0.0])  # a group of one never does


def test_overlong_penalty_by_hand():
    # L_max 10, L_cache 4: free up to 6; then (6 - L) / 4; -1 beyond 10.
    lengths = np.array([0, 6, 7, 8, 10, 11, 100])
    np.testing.assert_allclose(rl.overlong_penalty(lengths, 10, 4), [0, 0, -0.25, -0.5, -1, -1, -1])
    np.testing.assert_allclose(rl.overlong_penalty(lengths, 10, 4, penalty=0.5), [0, 0, -0.125, -0.25, -0.5, -0.5, -0.5])
    np.testing.assert_allclose(rl.overlong_penalty(lengths, 0, 0), np.zeros(7))  # off
    with pytest.raises(ValueError, match="cache_length"):
        rl.overlong_penalty(lengths, 10, 11)
