"""The prompt schedule: a pure function of (run seed, step), paced by the latest committed version."""

from hypothesis import given, strategies as st

from rlax_core.rollout.schedule import prompt_indices, rollout_prompt_id, sample_seed, steps_to_generate


def test_each_prompt_once_per_epoch_and_same_answer_every_time():
    num_prompts, per_step = 10, 4
    first_epoch = [i for step in range(5) for i in prompt_indices(7, step, num_prompts, per_step)][:num_prompts]
    assert sorted(first_epoch) == list(range(num_prompts))
    assert prompt_indices(7, 3, num_prompts, per_step) == prompt_indices(7, 3, num_prompts, per_step)
    assert prompt_indices(7, 0, num_prompts, per_step) != prompt_indices(8, 0, num_prompts, per_step)


def test_seeds_and_prompt_ids_depend_only_on_run_step_and_slot():
    assert sample_seed(0, 5) == sample_seed(0, 5)
    assert sample_seed(0, 5) != sample_seed(0, 6)
    assert rollout_prompt_id("run", 5, 2) == "run/5/2" != rollout_prompt_id("run", 5, 3)


@given(latest=st.integers(0, 50), k=st.integers(0, 4), total=st.integers(1, 60),
       done=st.sets(st.integers(0, 60), max_size=20))
def test_pacing_never_schedules_a_step_too_stale_for_the_trainer(latest, k, total, done):
    steps = steps_to_generate(latest, k, total, done)
    assert steps == sorted(steps)
    for step in steps:
        # generated now with version >= latest, trained at step `step`: staleness step - latest <= k
        assert latest <= step <= latest + k and step < total and step not in done


def test_synchronous_mode_waits_for_the_version_of_the_step():
    assert steps_to_generate(3, 0, 10, set()) == [3]
    assert steps_to_generate(3, 1, 10, {3}) == [4]
    assert steps_to_generate(9, 2, 10, set()) == [9]
