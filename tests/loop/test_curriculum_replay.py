"""A curriculum's loop replays exactly: a rollout job killed mid-step and restarted draws the same
prompts, and writes the same groups, as an uninterrupted run (docs/curriculum.md).

The rollout path the real job runs (``build_spec`` from the quickstart recipe, ``RolloutStream``: the
schedule, the real engine on stories260K, scoring, DAPO's dynamic sampling, writes, the step marker)
generates steps 0, 1, 2 with ``k = 0`` under the ``balanced`` curriculum, so steps 1 and 2 are drawn
from the scores of the steps before them. The interrupted run's job dies after writing part of step 1
(what ``WriteGroups`` leaves when its process is killed: some groups, no marker); a new job, with an
engine and a curriculum state of its own (a new process's), takes the run over.
"""

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.utils.shared import Shared

from pipelines.config import load_run_config
from pipelines.rl_stream import build_spec
from rlax_core.models import from_pretrained
from rlax_core.rollout.drawing import StepDraws
from rlax_core.rollout.schedule import WorkUnit
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.weights.store import WeightStore
from transforms.rollout import AssembleGroups, GenerateRollouts, RolloutStream, ScoreRollouts, WriteGroups

MODEL = str(Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K")
GROUPS, SAMPLES, STEPS = 4, 4, 3
RUNNER = "BundleBasedDirectRunner"


def _spec(root: Path, train_set: Path):
    run_config = load_run_config("quickstart", [
        f"run.output_dir={root}", f"loop.train_set={train_set}", f"trainer.groups_per_step={GROUPS}",
        f"trainer.total_steps={STEPS}", "trainer.max_staleness=0", f"loop.sampling.samples_per_prompt={SAMPLES}",
        "loop.sampling.stop_token_ids=[13, 1, 2]", "engine.replicas=1", "algorithm.preset=dapo", "algorithm.overlong_max_length=40",
        "algorithm.overlong_cache_length=16",
        "loop.curriculum.kind=balanced", "loop.curriculum.retire_after_solved=1"])
    spec = build_spec(run_config, train_set_size=12)
    with WeightStore(spec.weights) as weights:
        params = from_pretrained(MODEL).params
        for version in range(STEPS):  # the same values under each version: the draws are what differs
            weights.publish(version, params)
    return spec


def _stream_step(spec, version: int, shared: Shared) -> None:
    with TestPipeline(runner=RUNNER) as pipeline:
        ticks = pipeline | "Ticks" >> beam.Create([version])
        latest = pipeline | "Latest" >> beam.Create([version])
        _ = (ticks, latest) | RolloutStream(spec, shared)


def _killed_mid_step(spec, step: int, shared: Shared) -> None:
    """What a job killed during ``step`` leaves: the first unit's group written (or dropped), no marker."""
    with TestPipeline(runner=RUNNER) as pipeline:
        version = pipeline | "Version" >> beam.Create([step])
        assembled = (pipeline | beam.Create([WorkUnit(step, step, (0,))])
                     | beam.ParDo(GenerateRollouts(spec, shared), beam.pvalue.AsList(version))
                     | beam.ParDo(ScoreRollouts(spec))
                     | beam.ParDo(AssembleGroups(spec)).with_outputs(AssembleGroups.DROPPED, main="kept"))
        _ = assembled.kept | beam.ParDo(WriteGroups(spec))


def _outcome(spec):
    """Per step: each slot's prompt and samples (written groups' rows; dropped groups' recorded scores)."""
    store = spec.store()
    steps = {}
    for step in range(STEPS):
        written = {key.prompt_index: [(r["example_id"], r["completion_ids"], r["reward"]) for r in
                                      store.read_group(key).select(["example_id", "completion_ids", "reward"]).to_pylist()]
                   for key in store.list_groups() if key.step == step}
        steps[step] = {"written": written, "dropped": store.read_dropped_scores(step),
                       "marked": store.is_step_generated(step) or len(written) == GROUPS}
    return steps


@pytest.mark.slow  # compiles the engine three times (three jobs) and generates six steps
def test_a_rollout_job_killed_mid_step_and_restarted_draws_and_writes_what_an_uninterrupted_one_does(tmp_path):
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 12), train_set)

    whole = _spec(tmp_path / "whole", train_set)
    job = Shared()
    for version in range(STEPS):
        _stream_step(whole, version, job)

    interrupted = _spec(tmp_path / "interrupted", train_set)
    first_job = Shared()
    _stream_step(interrupted, 0, first_job)
    _killed_mid_step(interrupted, 1, first_job)
    assert not interrupted.store().is_step_generated(1)
    replacement = Shared()  # a new process: its own engine and curriculum state, read from the store
    for version in (1, 2):
        _stream_step(interrupted, version, replacement)

    expected, got = _outcome(whole), _outcome(interrupted)
    assert got == expected
    assert all(step["marked"] for step in got.values())
    assert any(step["dropped"] for step in got.values())  # dynamic sampling dropped groups: their scores counted
    drawn = {step: [StepDraws(whole).rows(step) for _ in range(2)] for step in range(STEPS)}
    assert all(a == b for a, b in drawn.values())
    assert StepDraws(interrupted).state_for(STEPS).to_json() == StepDraws(whole).state_for(STEPS).to_json()
    assert StepDraws(whole).state_for(2).next_step == 2  # k = 0: step 2 drew from steps 0 and 1's scores
    metrics = {m["step"]: m for m in whole.store().read_step_metrics()}
    assert metrics[2]["curriculum/draw_pass_rate"] is not None
    assert {m["curriculum/dropped_group_share"] for m in metrics.values()} == {
        m["groups_dropped_uniform"] / GROUPS for m in metrics.values()}
