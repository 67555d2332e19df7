"""DAPO's dynamic sampling accumulator and overlong reward shaping."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core import rl


def group(*rewards, group_id="g"):
    return [{"group_id": group_id, "sample_idx": i, "reward": r} for i, r in enumerate(rewards)]


def test_accumulator_drops_uniform_groups_and_fills_a_batch_in_arrival_order():
    accumulator = rl.GroupAccumulator(groups_per_batch=2, max_groups_seen=10)
    assert accumulator.groups_needed == 2
    assert accumulator.add(group(1.0, 1.0, 1.0, group_id="all right")) is False
    assert accumulator.add(group(0.0, 1.0, group_id="a")) is True
    assert accumulator.add(group(0.0, 0.0, group_id="all wrong")) is False
    assert not accumulator.is_full and accumulator.groups_needed == 1
    accumulator.add(group(0.5, 0.0, group_id="b"))
    accumulator.add(group(1.0, 0.0, group_id="surplus"))
    batch = accumulator.take_batch()
    assert [g[0]["group_id"] for g in batch] == ["a", "b"]
    assert accumulator.groups_needed == 1  # the surplus group carries over
    assert accumulator.metrics() == {
        "dynamic_sampling/groups_seen": 5.0,
        "dynamic_sampling/groups_dropped": 2.0,
        "dynamic_sampling/drop_rate": 0.4,
    }


def test_accumulator_gives_up_loudly_after_max_groups_seen():
    accumulator = rl.GroupAccumulator(groups_per_batch=2, max_groups_seen=3)
    for _ in range(3):
        accumulator.add(group(1.0, 1.0))
    with pytest.raises(rl.DynamicSamplingExhausted, match="saw 3 groups but only 0 of the 2"):
        accumulator.add(group(1.0, 1.0))


def test_accumulator_without_dropping_keeps_everything_and_rejects_bad_input():
    accumulator = rl.GroupAccumulator(groups_per_batch=1, drop_uniform=False)
    assert accumulator.add(group(1.0, 1.0)) and accumulator.is_full
    with pytest.raises(RuntimeError, match="batch not full"):
        rl.GroupAccumulator(groups_per_batch=1).take_batch()
    with pytest.raises(ValueError, match="no finite reward"):
        rl.GroupAccumulator(groups_per_batch=1).add(group(1.0, None))
    with pytest.raises(ValueError, match="groups_per_batch"):
        rl.GroupAccumulator(groups_per_batch=0)
    assert not rl.has_reward_variance([1.0]) and rl.has_reward_variance([1.0, 0.0])


def test_overlong_penalty_by_hand():
    # L_max 10, L_cache 4: free up to 6; then (6 - L) / 4; -1 beyond 10.
    lengths = np.array([0, 6, 7, 8, 10, 11, 100])
    np.testing.assert_allclose(rl.overlong_penalty(lengths, 10, 4), [0, 0, -0.25, -0.5, -1, -1, -1])
    np.testing.assert_allclose(rl.overlong_penalty(lengths, 10, 4, penalty=0.5), [0, 0, -0.125, -0.25, -0.5, -0.5, -0.5])
    np.testing.assert_allclose(rl.overlong_penalty(lengths, 0, 0), np.zeros(7))  # off
    with pytest.raises(ValueError, match="cache_length"):
        rl.overlong_penalty(lengths, 10, 11)


def test_shape_rewards_uses_the_config():
    config = rl.get_preset("dapo", overlong_max_length=10, overlong_cache_length=4)
    np.testing.assert_allclose(rl.shape_rewards(config, jnp.array([1.0, 1.0, 0.0]), jnp.array([5, 8, 12])), [1.0, 0.5, -1.0])
    np.testing.assert_allclose(rl.shape_rewards(rl.get_preset("grpo"), [1.0], [10**6]), [1.0])
