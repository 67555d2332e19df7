"""BatchReader: groups in schedule order, never past the first step still being generated."""
import threading

import pytest

from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.training.config import TrainerConfig
from rlax_core.training.job import BatchReader
from rlax_core.training.ledger import DataLedger

from training_helpers import write_random_groups


def _reader(tmp_path):
    store = RolloutStore(tmp_path / "rollouts", run="r")
    return store, BatchReader(store, TrainerConfig(groups_per_step=2, max_staleness=1, wait_timeout_s=0.6, poll_s=0.05))


def _take(reader, ledger, train_step):
    keys = [key for key, _ in reader.next_groups(ledger, train_step, threading.Event())]
    ledger.consumed.extend(keys)
    return keys


def test_a_later_step_waits_until_the_step_before_it_is_generated(tmp_path):
    # The race a restarted rollout pipeline produced: step 2's groups landed before step 1's. Taken
    # for train step 1, they would have left step 1's groups (weights v0) too stale for train step 2.
    store, reader = _reader(tmp_path)
    write_random_groups(store, [0, 2], groups_per_step=2)
    ledger = DataLedger()
    assert _take(reader, ledger, 0) == [GroupKey(0, 0), GroupKey(0, 1)]
    with pytest.raises(TimeoutError, match="0 of 2 rollout groups"):
        _take(reader, ledger, 1)
    write_random_groups(store, [1], groups_per_step=2)
    assert _take(reader, ledger, 1) == [GroupKey(1, 0), GroupKey(1, 1)]
    assert _take(reader, ledger, 2) == [GroupKey(2, 0), GroupKey(2, 1)]
    assert ledger.dropped == []


def test_a_step_marked_generated_with_fewer_groups_lets_the_next_step_fill_the_batch(tmp_path):
    # Dynamic sampling dropped one of step 0's prompts; its marker says the step is done anyway.
    store, reader = _reader(tmp_path)
    write_random_groups(store, [0], groups_per_step=1)
    write_random_groups(store, [1], groups_per_step=2)
    ledger = DataLedger()
    # Train step 1, which may use both steps' weights (versions 0 and 1).
    with pytest.raises(TimeoutError, match="1 of 2 rollout groups"):
        _take(reader, ledger, 1)
    store.mark_step_generated(0)
    assert store.is_step_generated(0) and not store.is_step_generated(1)
    assert _take(reader, ledger, 1) == [GroupKey(0, 0), GroupKey(1, 0)]


def test_while_waiting_runs_on_every_poll_until_the_groups_are_there(tmp_path):
    # The trainer repairs a weight version readers refused from here (rlax_core.weights.repair).
    store, reader = _reader(tmp_path)
    polls = []

    def while_waiting():
        polls.append(len(polls))
        if len(polls) == 3:
            write_random_groups(store, [0], groups_per_step=2)

    groups = reader.next_groups(DataLedger(), 0, threading.Event(), while_waiting=while_waiting)
    assert [key for key, _ in groups] == [GroupKey(0, 0), GroupKey(0, 1)] and polls == [0, 1, 2]


def test_the_first_wait_covers_the_rollout_fleets_start_up_and_later_ones_do_not(tmp_path):
    store = RolloutStore(tmp_path / "rollouts", run="r")
    reader = BatchReader(store, TrainerConfig(groups_per_step=2, max_staleness=1, wait_timeout_s=0.3, poll_s=0.05),
                         startup_wait_s=3.0)
    # The fleet starts up: its first groups land after 1 s, past wait_timeout_s but within the start-up.
    timer = threading.Timer(1.0, write_random_groups, args=(store, [0]), kwargs={"groups_per_step": 2})
    timer.start()
    ledger = DataLedger()
    assert _take(reader, ledger, 0) == [GroupKey(0, 0), GroupKey(0, 1)]
    timer.join()
    with pytest.raises(TimeoutError, match="after waiting 0 s"):  # then only wait_timeout_s
        _take(reader, ledger, 1)
