import threading
import time

import pytest

from rlax_core.data.rollout_store import GroupKey, RolloutStore


def group_rows(store, key, n=4, version=0, reward=1.0):
    return [dict(example_id="ex", group_id=store.group_id(key), sample_idx=i, policy_version=version,
                 seed=7 * i, prompt_ids=[1, 2], completion_ids=[3, 4, i], behavior_logprobs=[-0.5, -0.2, -0.1],
                 finish_reason="length", reward=reward, reward_info="{}") for i in reversed(range(n))]


@pytest.mark.parametrize("root_kind", ["local", "memory"])
def test_write_list_read_in_schedule_order(tmp_path, root_kind):
    root = tmp_path / "rollouts" if root_kind == "local" else f"memory://store-{time.time_ns()}"
    store = RolloutStore(root, run="r1")
    assert store.list_groups() == []
    keys = [GroupKey(2, 0), GroupKey(0, 11), GroupKey(0, 2), GroupKey(10, 1)]
    for key in keys:
        store.write_group(key, group_rows(store, key))
    assert store.list_groups() == sorted(keys) == [GroupKey(0, 2), GroupKey(0, 11), GroupKey(2, 0), GroupKey(10, 1)]
    table = store.read_group(GroupKey(0, 11))
    assert table.column("sample_idx").to_pylist() == [0, 1, 2, 3]
    assert table.column("completion_ids").to_pylist()[2] == [3, 4, 2]


def test_retried_write_replaces_the_same_file(tmp_path):
    store = RolloutStore(tmp_path, run="r1")
    key = GroupKey(3, 1)
    store.write_group(key, group_rows(store, key, reward=0.0))
    store.write_group(key, group_rows(store, key, reward=1.0))
    assert store.list_groups() == [key]
    assert store.read_group(key).column("reward").to_pylist() == [1.0] * 4
    assert sorted(p.name for p in (tmp_path / "r1" / "step_00000003").iterdir()) == ["group_00001.parquet"]


def test_rejects_rows_of_another_group(tmp_path):
    store = RolloutStore(tmp_path, run="r1")
    with pytest.raises(ValueError, match="must carry group_id 'r1/0/1'"):
        store.write_group(GroupKey(0, 1), group_rows(store, GroupKey(0, 2)))
    with pytest.raises(ValueError, match="lack field"):
        store.write_group(GroupKey(0, 1), [{"group_id": "r1/0/1"}])


def test_wait_returns_when_ready_and_times_out_loudly(tmp_path):
    store = RolloutStore(tmp_path, run="r1")
    late = GroupKey(0, 0)
    writer = threading.Timer(0.3, lambda: store.write_group(late, group_rows(store, late)))
    writer.start()
    assert store.wait_for_groups(lambda keys: len(keys) >= 1, timeout_s=10, poll_s=0.05) == [late]
    with pytest.raises(TimeoutError, match="not ready after"):
        store.wait_for_groups(lambda keys: len(keys) >= 2, timeout_s=0.2, poll_s=0.05)
    assert store.wait_for_groups(lambda keys: False, timeout_s=10, should_stop=lambda: True) == [late]
