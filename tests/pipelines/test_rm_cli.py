"""``rlax rm`` from the command line: bad pairs are one line, a stopped job resumed ends where an
uninterrupted one does, and ``rlax plan`` counts its trainer."""

import json
import signal
from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [{"id": f"p{i}", "prompt": f"Once upon a time, {name}", "chosen": f" {name} found a ball and was happy.",
          "rejected": f" {name} {name} {name} {name}"} for i, name in enumerate(["Lily", "Tom", "Max", "Sue", "Ben", "Mia"])]


def rlax_rm(tmp_path, data, *overrides):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return main(["rm", "--config", "quickstart", f"rm.data={data}", "rm.validation_fraction=0",
                     "rm.pairs_per_step=4", "trainer.checkpoint_every=2", "trainer.async_checkpointing=false",
                     "trainer.optimizer.learning_rate=3e-3", *overrides])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


@pytest.mark.parametrize("side", ["chosen", "rejected", "prompt"])
def test_a_pair_with_an_empty_side_is_one_line(tmp_path, capsys, side):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({**pair, side: "" if i == 3 else pair[side]}) + "\n"
                            for i, pair in enumerate(PAIRS)))
    code = rlax_rm(tmp_path, data, f"run.output_dir={tmp_path / 'run'}")
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not any("Traceback" in line for line in lines), lines[-20:]
    assert lines[-1].startswith("rlax rm: ") and f"preference pair 'p3': empty '{side}'" in lines[-1], lines[-3:]


@pytest.mark.parametrize("objective", ["rm", "dpo"])
def test_held_out_pairs_are_split_by_prompt_never_straddling_it(tmp_path, objective):
    from rlax_core.training.post_config import DpoConfig, RmConfig
    from pipelines.sft import split_pairs

    # 40 prompts x 4 pairs, each pair its own id; one prompt is written in two spellings that
    # normalise alike (case, white space), and its pairs still land together.
    pairs = [{"id": f"pair-{p}-{k}", "prompt": f"Once upon a time, child {p}", "chosen": f" good {k}",
              "rejected": f" bad {k}"} for p in range(40) for k in range(4)]
    pairs[1]["prompt"] = "ONCE upon  a time,   child 0"
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    config = {"rm": RmConfig, "dpo": DpoConfig}[objective](data=str(data), validation_fraction=0.3)
    train, held_out = split_pairs(config)
    assert len(train) + len(held_out) == len(pairs) and held_out and train
    prompt_of = {pair["id"]: pair["id"].split("-")[1] for pair in pairs}
    train_prompts, held_out_prompts = ({prompt_of[pair["id"]] for pair in side} for side in (train, held_out))
    assert not train_prompts & held_out_prompts, sorted(train_prompts & held_out_prompts)
    assert split_pairs(config) == (train, held_out)  # stable


def test_rlax_plan_counts_the_reward_model_trainer():
    from pipelines.config import load_run_config
    from pipelines.plan import memory_plans

    config = load_run_config(str(ROOT / "configs/quickstart.yaml"), ["rm.pairs_per_step=32"])
    plan, = memory_plans(config, ("rm",))
    assert plan.role == "rm" and plan.fits


@pytest.mark.slow  # two short jobs and a third that resumes (about 2 minutes on 2 loaded cores)
def test_a_stopped_rm_run_resumed_ends_where_an_uninterrupted_one_does(tmp_path):
    from safetensors.numpy import load_file

    from rlax_core.training.reward_model import read_score_stats

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(pair) + "\n" for pair in PAIRS))
    assert rlax_rm(tmp_path, data, f"run.output_dir={tmp_path / 'whole'}", "trainer.total_steps=4") == 0
    assert rlax_rm(tmp_path, data, f"run.output_dir={tmp_path / 'split'}", "trainer.total_steps=2") == 0
    assert rlax_rm(tmp_path, data, f"run.output_dir={tmp_path / 'split'}", "trainer.total_steps=4") == 0
    whole = load_file(tmp_path / "whole/hf/step_00000004/model.safetensors")
    split = load_file(tmp_path / "split/hf/step_00000004/model.safetensors")
    assert "score.weight" in whole and "lm_head.weight" not in whole
    for name, array in whole.items():
        np.testing.assert_array_equal(split[name], array, err_msg=name)
    assert read_score_stats(tmp_path / "whole/hf/step_00000004") == read_score_stats(tmp_path / "split/hf/step_00000004")


SEVEN_B_RM = ["loop.rewards.terms={reward_model: 1.0, math: 0.0}", "loop.rewards.reward_model.path=gs://bucket/models/Qwen2.5-7B",
              "loop.rewards.reward_model.dtype=bfloat16"]


def test_rlax_compile_refuses_a_7b_reward_model_beside_the_7b_policy_with_the_numbers(capsys):
    # The same refusal as rlax plan's, before anything is compiled: the rollout chip holds neither whole.
    code = main(["compile", "--config", "qwen25_7b_math_dataflow_tpu.yaml", *SEVEN_B_RM])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("rlax compile: config error: engine.num_pages: auto")
    assert "reward model weights 13.17 GiB" in line and "total 23.00 GiB of 14.40 GiB usable" in line


def test_on_its_own_stage_a_7b_reward_model_is_planned_on_its_own_chips():
    from pipelines.config import load_run_config
    from pipelines.plan import memory_plans

    own = [*SEVEN_B_RM, "loop.rewards.reward_model.placement=own_stage"]
    config = load_run_config("qwen25_7b_math_dataflow_tpu.yaml", own)  # the rollout chips hold the policy alone
    rollout, = memory_plans(config, ("rollout",))
    assert "reward model weights" not in rollout.parts and rollout.fits
    on_v5e, = memory_plans(config, ("reward_model",))  # by default the rollout fleet's kind of chip: too small
    assert on_v5e.chip == "v5e" and not on_v5e.fits
    on_v5p, = memory_plans(load_run_config("qwen25_7b_math_dataflow_tpu.yaml", [
        *own, "hardware.reward_model={chip: v5p, chips_per_host: 4, hosts: 4}"]), ("reward_model",))
    assert on_v5p.fits and on_v5p.parts["reward model weights"] == on_v5e.parts["reward model weights"]
