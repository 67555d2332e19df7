"""The rollout DoFns on the real stories260K model: version stamps, exact regeneration, idempotent writes."""

import json
import uuid
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from apache_beam.utils.shared import Shared

from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.inference.config import EngineConfig
from rlax_core.models import from_pretrained
from rlax_core.rollout.schedule import WorkUnit
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.weights.config import WeightStoreConfig
from rlax_core.weights.store import WeightStore
from tests.support.rollout_spec import rollout_spec
from transforms.rollout import AssembleGroups, GenerateRollouts, ScheduleSteps, ScoreRollouts, WriteGroups

# In-process, so that the shared engine is built once for the module and results can be collected.
RUNNER = "BundleBasedDirectRunner"
MODEL = str(Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K")


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    weights = WeightStoreConfig(root=str(root / "weights"), run_id="t")
    model = from_pretrained(MODEL)
    with WeightStore(weights) as store:
        store.publish(0, model.params)
        store.publish(3, model.params)  # same values, another version: the stamp must follow the version
    train_set = root / "train.jsonl"
    write_jsonl(story_examples("train", 8), train_set)
    return rollout_spec(
        root, run="t", model_path=MODEL, train_set=str(train_set), train_set_size=8, weights=weights,
        engine=EngineConfig(num_slots=8, num_pages=64, max_prompt_len=64, max_new_tokens=12, prefill_buckets=(32, 64),
                            attention_impl="reference"),
        temperature=1.0, samples_per_prompt=3, stop_token_ids=(13, 1, 2),
        groups_per_step=2, total_steps=4, max_staleness=3)  # lets version 0 make steps 0..3


class _AppendJson(beam.DoFn):
    """Collects elements into a JSON-lines file (DoFns are pickled, so a Python list would not fill)."""

    def __init__(self, path):
        self._path = str(path)

    def process(self, element):
        with open(self._path, "a") as sink:
            sink.write(json.dumps(element) + "\n")


def _generate(spec, step, version):
    """Run schedule-step ``step`` at ``version`` through generation and scoring; the groups as a list."""
    path = Path(spec.rollout_root).parent / f"collected-{uuid.uuid4().hex}.jsonl"
    with TestPipeline(runner=RUNNER) as p:
        version_side = p | "Version" >> beam.Create([version])
        groups = (p | beam.Create([WorkUnit(step, version, (0, 1))])
                  | beam.ParDo(GenerateRollouts(spec, Shared()), beam.pvalue.AsList(version_side))
                  | beam.ParDo(ScoreRollouts(spec)))
        assert_that(groups | beam.Map(lambda g: len(g["rows"])), lambda sizes: _check(sizes == [3, 3], sizes))
        groups | beam.ParDo(_AppendJson(path))
    out = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(out, key=lambda g: g["key"])


def _check(ok, what):
    if not ok:
        raise AssertionError(what)


@pytest.mark.slow  # compiles the engine (tens of seconds on 2 shared cores)
def test_rollouts_carry_the_version_that_generated_them(spec):
    groups = _generate(spec, step=1, version=3)
    assert [tuple(g["key"]) for g in groups] == [(1, 0), (1, 1)]
    for group in groups:
        assert {row["policy_version"] for row in group["rows"]} == {3}
        assert all(row["reward"] is not None and row["reward_info"] for row in group["rows"])
        assert [row["sample_idx"] for row in group["rows"]] == [0, 1, 2]


@pytest.mark.slow  # compiles the engine (tens of seconds on 2 shared cores)
def test_a_rollout_regenerated_for_the_same_step_and_version_is_identical(spec):
    first, again = _generate(spec, step=2, version=0), _generate(spec, step=2, version=0)
    fields = ("example_id", "group_id", "sample_idx", "seed", "prompt_ids", "completion_ids", "behavior_logprobs",
              "reward")
    assert [[{f: r[f] for f in fields} for r in g["rows"]] for g in first] == \
           [[{f: r[f] for f in fields} for r in g["rows"]] for g in again]
    other_step = _generate(spec, step=3, version=0)
    assert [r["completion_ids"] for r in first[0]["rows"]] != [r["completion_ids"] for r in other_step[0]["rows"]]


@pytest.mark.slow  # compiles the engine (tens of seconds on 2 shared cores)
def test_writing_a_group_twice_leaves_one_group(spec):
    group = _generate(spec, step=0, version=0)[0]
    with TestPipeline(runner=RUNNER) as p:
        written = p | beam.Create([group, group]) | beam.ParDo(WriteGroups(spec))
        assert_that(written | beam.Map(lambda kv: kv[0]), lambda steps: _check(list(steps) == [0, 0], steps))
    store = RolloutStore(spec.rollout_root, spec.run)
    group["key"] = tuple(group["key"])
    assert store.list_groups() == [GroupKey(0, group["key"][1])]
    assert store.read_group(GroupKey(0, group["key"][1])).num_rows == 3


def test_schedule_emits_only_steps_the_version_allows(spec):
    with TestPipeline(runner=RUNNER) as p:
        version = p | "Version" >> beam.Create([2])
        steps = p | beam.Create([None]) | beam.ParDo(ScheduleSteps(spec), beam.pvalue.AsList(version))
        # one work unit per prompt group (groups_per_unit = 1), two groups per step
        assert_that(steps | beam.Map(lambda s: s.step), lambda got: _check(sorted(got) == [2, 2, 3, 3], got))


def test_dynamic_sampling_sends_groups_of_equal_task_rewards_to_dropped():
    import json

    from rlax_core.rl.presets import get_preset

    def group(slot, *rewards, shaped=()):  # shaped: rewards after an overlong penalty
        infos = [{"task_reward": r} if shaped else {} for r in rewards]
        return {"key": (0, slot), "rows": [{"reward": (shaped or rewards)[i], "reward_info": json.dumps(info),
                                            "group_id": "g", "sample_idx": i} for i, info in enumerate(infos)]}

    # All right, but one sample penalised for its length: no learning signal in the task reward.
    groups = [group(0, 0.0, 0.0), group(1, 0.0, 1.0), group(2, 1.0, 1.0, shaped=(1.0, 0.5))]
    dapo = rollout_spec(model_path=MODEL, algorithm=get_preset("dapo"))
    with TestPipeline(runner=RUNNER) as p:
        out = p | beam.Create(groups) | beam.ParDo(AssembleGroups(dapo)).with_outputs(
            AssembleGroups.DROPPED, main="kept")
        assert_that(out.kept | "K" >> beam.Map(lambda g: g["key"]), lambda k: _check(list(k) == [(0, 1)], k),
                    label="kept")
        assert_that(out.dropped | "D" >> beam.Map(lambda g: g["key"]),
                    lambda k: _check(sorted(k) == [(0, 0), (0, 2)], k), label="dropped")
    grpo = rollout_spec(model_path=MODEL)  # no dynamic sampling: every group is written
    with TestPipeline(runner=RUNNER) as p:
        out = p | beam.Create(groups) | beam.ParDo(AssembleGroups(grpo)).with_outputs(
            AssembleGroups.DROPPED, main="kept")
        assert_that(out.kept | beam.combiners.Count.Globally(), lambda n: _check(list(n) == [3], n))


@pytest.mark.slow  # compiles the engine (tens of seconds on 2 shared cores)
def test_a_corrupted_newest_version_is_skipped_and_generation_goes_on_with_the_last_good_one(spec, tmp_path):
    import dataclasses

    from apache_beam.metrics.metric import MetricsFilter

    from rlax_core.weights import manifest as mf

    weights = WeightStoreConfig(root=str(tmp_path / "weights"), run_id="t")
    healing = dataclasses.replace(spec, weights=weights, rollout_root=str(tmp_path / "rollouts"))
    params = from_pretrained(MODEL).params
    with WeightStore(weights) as store:
        store.publish(1, params)
        store.publish(2, params)
        tensor = store.manifest(2).tensors[0]
        path = f"{mf.version_dir(2)}/{tensor.shards[0].file}"
        store.storage.write(path, store.storage.read(path)[:-4])  # the newest version, damaged after its commit
    collected = tmp_path / "collected.jsonl"
    p = TestPipeline(runner=RUNNER)
    version_side = p | "Version" >> beam.Create([2])
    (p | beam.Create([WorkUnit(2, 2, (0, 1))])
       | beam.ParDo(GenerateRollouts(healing, Shared()), beam.pvalue.AsList(version_side))
       | beam.Map(lambda g: {"key": g["key"], "versions": [r["policy_version"] for r in g["rows"]]})
       | beam.ParDo(_AppendJson(collected)))
    result = p.run()
    result.wait_until_finish()
    groups = sorted((json.loads(line) for line in collected.read_text().splitlines()), key=lambda g: g["key"])
    assert [(tuple(g["key"]), set(g["versions"])) for g in groups] == [((2, 0), {1}), ((2, 1), {1})]
    refused = result.metrics().query(MetricsFilter().with_name("weight_versions_refused"))["counters"]
    assert sum(c.committed for c in refused) == 1
