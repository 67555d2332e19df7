"""The ``dapo`` preset in the streaming loop: its overlong shaping changes the rewards of over-long
samples, and its dynamic sampling drops the groups whose task rewards are all equal.

The rollout path the real job runs (``rlax rollout``'s spec from the recipe, ``RolloutStream``: the
schedule, the real engine on stories260K, scoring, assembly, writes) runs twice on the same prompts
and seeds, once with the quickstart's ``grpo`` and once with ``dapo``: a sample's tokens are keyed by
(run, step, slot, index) only, so the two runs sample the same completions, and the ``grpo`` run's
store says what ``dapo`` must keep and what each kept reward must become.
"""

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from pipelines.config import load_run_config
from pipelines.rl_stream import build_spec
from rlax_core.data.rollout_store import RolloutStore
from rlax_core.models import from_pretrained
from rlax_core.rl.dynamic_sampling import has_reward_variance
from rlax_core.rl.reward_shaping import overlong_penalty
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.weights.store import WeightStore
from transforms.rollout import RolloutStream

MODEL = str(Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K")
GROUPS, SAMPLES = 8, 4
# The story task's budget is 64 tokens: DAPO's band, rescaled to it, penalises a completion past 24 tokens.
L_MAX, L_CACHE = 40, 16


def _stream(root: Path, train_set: Path, algorithm: list[str]) -> RolloutStore:
    """One schedule step of the quickstart recipe through ``RolloutStream`` with ``algorithm`` overrides."""
    run_config = load_run_config("quickstart", [
        f"run.output_dir={root}", f"loop.train_set={train_set}", f"trainer.groups_per_step={GROUPS}",
        "trainer.total_steps=1", "trainer.max_staleness=0", f"loop.sampling.samples_per_prompt={SAMPLES}",
        "loop.sampling.stop_token_ids=[13, 1, 2]", "engine.replicas=1", *algorithm])
    spec = build_spec(run_config, train_set_size=12)
    with WeightStore(spec.weights) as weights:
        weights.publish(0, from_pretrained(MODEL).params)
    with TestPipeline(runner="BundleBasedDirectRunner") as pipeline:
        ticks = pipeline | "Ticks" >> beam.Create([0])
        latest = pipeline | "Latest" >> beam.Create([0])
        _ = (ticks, latest) | RolloutStream(spec)
    return spec.store()


def _groups(store: RolloutStore) -> dict[int, list[dict]]:
    return {key.prompt_index: sorted(store.read_group(key).to_pylist(), key=lambda row: row["sample_idx"])
            for key in store.list_groups()}


@pytest.mark.slow  # compiles and runs the engine twice
def test_the_dapo_preset_shapes_overlong_rewards_and_drops_uniform_groups_in_the_stream(tmp_path):
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 12), train_set)
    plain = _groups(_stream(tmp_path / "grpo", train_set, ["algorithm.preset=grpo"]))
    dapo_store = _stream(tmp_path / "dapo", train_set, [
        "algorithm.preset=dapo", f"algorithm.overlong_max_length={L_MAX}", f"algorithm.overlong_cache_length={L_CACHE}"])
    dapo = _groups(dapo_store)

    assert len(plain) == GROUPS  # grpo writes every group, its rewards unshaped
    assert all("task_reward" not in json.loads(row["reward_info"]) for rows in plain.values() for row in rows)
    informative = {slot for slot, rows in plain.items() if has_reward_variance([row["reward"] for row in rows])}
    assert set(dapo) == informative  # dynamic sampling: exactly the groups whose task rewards differ
    assert 0 < len(informative) < GROUPS  # both kinds occur here, so the test tells them apart
    [metrics] = dapo_store.read_step_metrics()
    assert metrics["groups_dropped_uniform"] == GROUPS - len(informative)

    penalised = 0
    for slot, rows in dapo.items():
        for shaped, row in zip(rows, plain[slot]):
            assert shaped["completion_ids"] == row["completion_ids"]  # the same sample in both runs
            penalty = float(overlong_penalty(len(row["completion_ids"]), L_MAX, L_CACHE))
            info = json.loads(shaped["reward_info"])
            assert info["task_reward"] == row["reward"] and info["overlong_penalty"] == pytest.approx(penalty)
            assert shaped["reward"] == pytest.approx(row["reward"] + penalty)
            penalised += penalty < 0
    assert penalised > 0  # over-long samples were there, and their rewards changed
