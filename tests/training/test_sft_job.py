"""``rlax sft`` end to end on stories260K: verified story-task samples lower the held-out NLL.

The samples stand in for what the rejection-sampling pipeline keeps (completions the story task's
verifier passes): each is checked with ``score_story`` here, so the set is verified, not assumed.
"""

import itertools
import json
from pathlib import Path

import pytest

from rlax_core.config import InputError
from rlax_core.tasks.story import score_story
from rlax_core.utils.metrics import read_metrics
from pipelines.config import load_run_config
from pipelines.sft import sft

ROOT = Path(__file__).resolve().parents[2]
SUBJECTS = ["The little dog", "A kind girl", "The old cat", "Her best friend", "The small bird", "A brave boy"]
REASONS = ["because the sun came out over the big green hill", "when she found a red ball under the bed",
           "after they shared a warm cake in the park", "since the rain stopped and the sky turned blue"]


def verified_records(prompts):
    completions = [f" {subject} was happy {reason}.\n" for subject, reason in itertools.product(SUBJECTS, REASONS)]
    for completion in completions:
        assert score_story(completion, "stop")[1]["pass"], completion
    return [{"id": f"sft-{i:03d}", "prompt": prompt, "completion": completion}
            for i, (prompt, completion) in enumerate(zip(prompts, completions))]


@pytest.fixture(scope="module")
def story_prompts():
    with open(ROOT / "pipelines/assets/story_task/train.jsonl") as handle:
        return [json.loads(line)["prompt"] for line in handle][:24]


def run_sft(tmp_path, data, *overrides):
    config = load_run_config(str(ROOT / "configs/quickstart.yaml"), [
        f"run.output_dir={tmp_path}", f"sft.data={data}", "sft.examples_per_step=8", "sft.validation_fraction=0.25",
        "sft.eval_every=4", "trainer.total_steps=8", "trainer.checkpoint_every=4", "trainer.async_checkpointing=false",
        "trainer.optimizer.learning_rate=3e-3", *overrides])
    return sft(config)


@pytest.mark.slow
@pytest.mark.long  # an end-to-end job (188 s measured on a 2-core machine at load average 24)
def test_sft_on_verified_story_samples_lowers_heldout_nll(tmp_path, story_prompts):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in verified_records(story_prompts)))
    result = run_sft(tmp_path / "run", data)
    assert result.step == 8 and not result.preempted
    rows = read_metrics(tmp_path / "run/metrics")
    nll = {row["step"]: row["train/heldout_nll"] for row in rows if "train/heldout_nll" in row}
    assert sorted(nll) == [0, 4, 8]
    assert nll[8] < nll[0] - 0.2, nll
    trained = [row for row in rows if "train/loss" in row]
    assert all(row["data/refused"] == 0 and "data/truncated" in row and "data/windowed" in row for row in trained)
    assert all(row["train/tokens_per_s"] > 0 for row in trained) and trained[-1]["train/loss"] < trained[0]["train/loss"]
    assert (tmp_path / "run/hf/step_00000008/config.json").exists()
    # A finished run started again resumes at its last checkpoint and has nothing left to do.
    assert run_sft(tmp_path / "run", data).resumed_from == 8


def test_a_record_without_a_completion_stops_the_job_with_one_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"id": "x1", "prompt": "Once upon a time"}) + "\n")
    with pytest.raises(InputError, match="record x1: an SFT example needs a completion"):
        run_sft(tmp_path / "run", data, "sft.validation_fraction=0")


def test_rlax_plan_covers_the_sft_dpo_and_rm_trainers():
    from pipelines.plan import POST_TRAINING_ROLES, memory_plans

    config = load_run_config(str(ROOT / "configs/quickstart.yaml"), ["sft.examples_per_step=64"])
    plans = {plan.role: plan for plan in memory_plans(config, POST_TRAINING_ROLES)}
    assert set(plans) == {"sft", "dpo", "rm"} and all(plan.fits for plan in plans.values())
    precomputed = memory_plans(load_run_config(str(ROOT / "configs/quickstart.yaml"), ["dpo.reference=precomputed"]),
                               ("dpo",))[0]
    assert precomputed.total < plans["dpo"].total  # no frozen reference held when its log-probs came first


@pytest.mark.slow
def test_a_stopped_sft_run_resumed_ends_where_an_uninterrupted_one_does(tmp_path, story_prompts):
    import numpy as np
    from safetensors.numpy import load_file

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in verified_records(story_prompts)))
    run_sft(tmp_path / "whole", data)
    run_sft(tmp_path / "split", data, "trainer.total_steps=4")  # stops at its checkpoint 4 ...
    assert run_sft(tmp_path / "split", data).resumed_from == 4  # ... and the next run takes steps 5 to 8
    whole = load_file(tmp_path / "whole/hf/step_00000008/model.safetensors")
    split = load_file(tmp_path / "split/hf/step_00000008/model.safetensors")
    for name, array in whole.items():
        np.testing.assert_array_equal(split[name], array, err_msg=name)
