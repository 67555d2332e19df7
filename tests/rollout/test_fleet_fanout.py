"""Work units smaller than a step: every worker of the fleet shares every step, none generates a group twice."""

import os
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from hypothesis import given, strategies as st

from rlax_core.config import ConfigError
from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.inference.config import EngineConfig
from rlax_core.models import from_pretrained
from rlax_core.rollout import RolloutSpec
from rlax_core.rollout.schedule import WorkUnit, work_units
from rlax_core.rollout.pacing import StepPacer
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.weights.store import WeightStore
from tests.support.rollout_spec import rollout_spec
from transforms.rollout import RolloutStream, ScheduleSteps

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "pipelines" / "assets" / "stories260K")


@given(prompts=st.integers(1, 64), per_unit=st.integers(1, 70))
def test_the_units_of_a_step_hold_each_of_its_slots_once(prompts, per_unit):
    units = work_units(prompts, per_unit)
    assert sorted(slot for unit in units for slot in unit) == list(range(prompts))
    assert all(1 <= len(unit) <= per_unit for unit in units)
    assert len(units) == -(-prompts // per_unit)


def test_work_units_refuse_a_size_below_one():
    with pytest.raises(ValueError, match="groups_per_unit"):
        work_units(8, 0)


def _spec(root: Path, **overrides) -> RolloutSpec:
    train_set = root / "train.jsonl"
    write_jsonl(story_examples("train", 16), train_set)
    fields = dict(
        run="fleet", model_path=MODEL, train_set=str(train_set), train_set_size=16,
        engine=EngineConfig(num_slots=8, num_pages=64, max_prompt_len=64, max_new_tokens=8, prefill_buckets=(32, 64),
                            attention_impl="reference"),
        temperature=1.0, samples_per_prompt=2, stop_token_ids=(13, 1, 2),
        groups_per_step=4, total_steps=3, max_staleness=1, groups_per_unit=1)
    fields.update(overrides)
    return rollout_spec(root, **fields)


def _check(ok, what):
    if not ok:
        raise AssertionError(what)


def test_the_schedule_emits_each_allowed_step_as_units_of_groups(tmp_path):
    spec = _spec(tmp_path, groups_per_unit=3)
    with TestPipeline(runner="BundleBasedDirectRunner") as p:
        version = p | "Version" >> beam.Create([1])
        units = p | beam.Create([None]) | beam.ParDo(ScheduleSteps(spec), beam.pvalue.AsList(version))
        expected = [WorkUnit(step, 1, slots) for step in (1, 2) for slots in [(0, 1, 2), (3,)]]
        assert_that(units, lambda got: _check(sorted(got, key=lambda u: (u.step, u.slots)) == expected, got))


class _CountingStore(RolloutStore):
    """The real store, counting its listings."""

    listings = 0

    def list_groups(self):
        type(self).listings += 1
        return super().list_groups()


def test_the_schedule_lists_the_store_only_for_steps_neither_known_complete_nor_in_flight(tmp_path):
    spec = _spec(tmp_path, run=f"listings-{tmp_path.name}", groups_per_step=2, total_steps=4, max_staleness=1)
    schedule = StepPacer(spec)
    schedule.store = store = _CountingStore(spec.rollout_root, spec.run)

    def tick(version):
        before = store.listings
        steps = sorted({unit.step for unit in schedule.units(version)})
        return steps, store.listings - before

    assert tick(0) == ([0, 1], 1)
    assert tick(0) == ([], 0)  # both in flight: no listing
    for step in (0, 1):
        for slot in range(2):
            rows = [dict(example_id="e", group_id=store.group_id(GroupKey(step, slot)), sample_idx=0,
                         policy_version=0, seed=0, prompt_ids=[1], completion_ids=[2], behavior_logprobs=[-1.0],
                         finish_reason="stop", reward=1.0, reward_info="{}")]
            store.write_group(GroupKey(step, slot), rows)
        spec.claims().release(spec.run, step)  # as MarkStepGenerated does
    assert tick(0) == ([], 1)  # finds both complete
    assert tick(0) == ([], 0)  # and remembers it
    assert tick(1) == ([2], 1)  # a new version: only its new step is looked up
    for step in (2, 3):
        spec.claims().release(spec.run, step)


def test_a_spec_refuses_units_of_no_groups(tmp_path):
    with pytest.raises(ConfigError, match="groups_per_unit"):
        _spec(tmp_path, groups_per_unit=0)


@pytest.mark.slow  # two SDK worker processes each compile the engine
def test_two_workers_share_one_step_and_together_write_each_of_its_groups_once(tmp_path, monkeypatch):
    spec = _spec(tmp_path, total_steps=1, max_staleness=0)
    with WeightStore(spec.weights) as weights:
        weights.publish(0, from_pretrained(MODEL).params)
    # The worker processes import this checkout's packages like the test does.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    options = PipelineOptions(direct_num_workers=2, direct_running_mode="multi_processing")
    pipeline = beam.Pipeline(runner="FnApiRunner", options=options)
    ticks = pipeline | "Tick" >> beam.Create([None])  # a tick without a version: the side input names it
    latest = pipeline | "Latest" >> beam.Create([0])
    (ticks, latest) | RolloutStream(spec)
    result = pipeline.run()
    result.wait_until_finish()

    generated = result.metrics().query(MetricsFilter().with_name("groups_generated"))["counters"]
    assert sum(counter.committed for counter in generated) == spec.prompts_per_step  # none generated twice
    store = RolloutStore(spec.rollout_root, spec.run)
    assert store.list_groups() == [GroupKey(0, slot) for slot in range(spec.prompts_per_step)]
    (metrics,) = RolloutStore(spec.rollout_root, spec.run).read_step_metrics()
    assert metrics["groups"] == spec.prompts_per_step and metrics["workers"] == 2  # both generated step 0
    rows = [row for key in store.list_groups() for row in store.read_group(key).to_pylist()]
    assert len({(row["group_id"], row["sample_idx"]) for row in rows}) == len(rows) == 4 * 2
    assert {row["policy_version"] for row in rows} == {0}


@pytest.mark.slow  # builds and compiles an engine
def test_threads_of_a_worker_share_one_engine_call_and_each_gets_its_own_groups(tmp_path):
    import threading
    import time

    from rlax_core.inference.engine import Request
    from rlax_core.rollout.worker import RolloutWorker

    spec = _spec(tmp_path)
    with WeightStore(spec.weights) as weights:
        weights.publish(0, from_pretrained(MODEL).params)
    worker = RolloutWorker(spec)
    examples = spec.examples()
    units = {name: ([Request(worker.host.prompt_ids(examples[row]), spec.sampling(), prompt_id=f"{name}/{row}", seed=row)],
                    oldest) for name, row, oldest in [("a", 0, 0), ("b", 1, 0), ("c", 2, 0), ("too-new", 3, 5)]}
    results = {}

    def generate(name):
        results[name] = worker.generate([units[name]], version=0)

    with worker.host.lock:  # the engine is busy: every thread's units wait for its next call
        threads = [threading.Thread(target=generate, args=(name,)) for name in units]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(worker._waiting) < len(units):
            assert time.monotonic() < deadline, "the threads did not queue their units"
            time.sleep(0.01)
    for thread in threads:
        thread.join(timeout=300)
        assert not thread.is_alive()
    assert worker.engine_calls == 1  # four threads, one engine call
    for name in ("a", "b", "c"):
        (completions,) = results[name].results
        assert {c.prompt_id for c in completions} == {units[name][0][0].prompt_id}
        assert [c.sample_index for c in completions] == list(range(spec.loop.sampling.samples_per_prompt))
        assert {c.weight_version for c in completions} == {0}
    assert results["too-new"].results == [None] and results["too-new"].loaded == 0  # needs version 5: deferred


def test_a_tick_carries_its_version_when_the_side_input_is_not_there_yet(tmp_path):
    spec = _spec(tmp_path, run=f"tick-{tmp_path.name}", groups_per_step=1, total_steps=4, max_staleness=1)
    schedule = ScheduleSteps(spec)
    schedule.setup()
    assert list(schedule.process(None, [])) == []  # nothing published yet
    assert sorted(unit.step for unit in schedule.process(2, [])) == [2, 3]  # the tick's version
    for step in (2, 3):
        spec.claims().release(spec.run, step)
    # The newest of the tick's and the side input's (a window fired twice hands over both panes).
    assert sorted(unit.step for unit in schedule.process(1, [2, 1])) == [2, 3]
    for step in (2, 3):
        spec.claims().release(spec.run, step)
