"""``rlax launch`` of a staged recipe (pipelines.launch_stages): the plan's wiring, ``--dry-run``,
finished stages skipped, refusals in one line; and the warm recipe end to end at a tiny size (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.config import find_config
from pipelines.launch import launch
from pipelines.launch_stages import plan, run_stages
from rlax_core.config import ConfigError, InputError

REPO = Path(__file__).resolve().parents[2]
WARM = str(find_config("configs/quickstart_warm.yaml").resolve())
BASE = str(REPO / "pipelines" / "assets" / "stories260K")


def by_name(stages):
    return {stage.name: stage for stage in stages}


def test_each_stage_reads_what_the_one_before_it_leaves(tmp_path):
    out = tmp_path / "run"
    stages = by_name(plan(WARM, [f"run.output_dir={out}"]))
    assert list(stages) == ["curate", "rft", "sft", "filter", "rl", "evaluate"]
    curated, sft_model = f"{out}/curated/examples-*.parquet", f"{out}/sft/hf/step_00000012"
    assert dict(stages["curate"].outputs)["examples"] == curated
    # RFT samples the curated prompts with the base model; its verified rows are SFT's data
    assert dict(stages["rft"].inputs) == {"prompts": curated, "generator": BASE}
    assert dict(stages["sft"].inputs) == {"data": f"{out}/rft/sft-*.parquet", "model": BASE}
    assert stages["sft"].argv[:3] == ("sft", "--config", WARM)
    assert "trainer.total_steps=12" in stages["sft"].overrides  # the recipe's stage_overrides.sft
    assert stages["sft"].overrides[-1] == f"run.output_dir={out}/sft"  # the wiring comes last
    # from here on the policy is SFT's final export: the filter samples it, RL starts from it
    assert dict(stages["sft"].outputs)["model"] == sft_model
    assert stages["sft"].marker == f"{sft_model}/config.json"
    assert dict(stages["filter"].inputs) == {"prompts": curated, "model": sft_model}
    assert f"model.path={sft_model}" in stages["rl"].overrides and f"run.output_dir={out}/rl" in stages["rl"].overrides
    assert stages["rl"].train_set == f"{out}/filtered/examples-*.parquet" and stages["rl"].argv == ()
    assert stages["rl"].marker == f"{out}/rl/checkpoints/30/rlax_seal.json"  # the ledger's checkpoint of step 30
    final = f"weights:{out}/rl/weights"
    assert dict(stages["rl"].outputs)["final version"] == final
    # evaluate: the base, SFT's export and RL's final version side by side
    models = [f"{what}: {path}" for what, path in stages["evaluate"].inputs if what.startswith("model")]
    assert models == [f"model base: {BASE}", f"model sft: {sft_model}", f"model rl: {final}"]
    assert [before for before, _ in stages["rl"].after] == ["curate", "filter", "sft"]
    assert not out.exists()  # planning writes nothing


def test_the_rm_stage_trains_on_rfts_pairs_and_pays_the_rl_stage(tmp_path):
    out = tmp_path / "run"
    stages = by_name(plan(WARM, [f"run.output_dir={out}", "stages=[curate, rft, rm, sft, rl]", "rft.pairs_per_prompt=2",
                                 "loop.rewards.terms={reward_model: 1.0, story_word: 0.0}",
                                 "loop.rewards.reward_model.path=runs/rm/reward_model",  # the recipe's: rewired
                                 'stage_overrides.rm=["trainer.total_steps=4"]']))
    reward_model = f"{out}/rm/hf/step_00000004"
    assert dict(stages["rm"].inputs) == {"data": f"{out}/rft/pairs-*.parquet", "model": BASE}
    assert stages["rm"].marker == f"{reward_model}/config.json" and stages["rm"].argv[0] == "rm"
    assert f"loop.rewards.reward_model.path={reward_model}" in stages["rl"].overrides
    assert ("rm", stages["rm"].marker) in stages["rl"].after
    with pytest.raises(ConfigError, match="^loop.rewards.terms: the rm stage trains the model the rl stage's "
                                          "reward_model term reads, and the terms name none"):
        plan(WARM, [f"run.output_dir={out}", "stages=[curate, rft, rm, sft, rl]", "rft.pairs_per_prompt=2"])


def test_dry_run_prints_each_stage_with_its_inputs_and_outputs_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["launch", "--config", WARM, "--output", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "6 stages of" in printed and "curate -> rft -> sft -> filter -> rl -> evaluate" in printed
    assert f"     reads   model: {out}/sft/hf/step_00000012" in printed  # the filter's model
    assert f"     writes  examples: {out}/filtered/examples-*.parquet" in printed
    assert "(done" not in printed
    assert not out.exists()  # not even the folder


def test_a_finished_stage_is_skipped_and_one_whose_input_is_missing_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    stages = by_name(plan(WARM, [f"run.output_dir={out}"]))
    finished = [stages[name] for name in ("curate", "rft", "filter")]
    for stage in finished:  # their markers are there; sft's is not (as if its folder had been removed)
        Path(stage.marker).parent.mkdir(parents=True)
        Path(stage.marker).write_text("{}")
    with pytest.raises(InputError) as error:  # the rl stage: refused before it starts
        run_stages([*finished, stages["rl"]], WARM, out / "logs", run_loop=launch)
    message = str(error.value)
    assert message == (f"the rl stage reads what the sft stage leaves, and that stage has not finished "
                       f"({out}/sft/hf/step_00000012/config.json is missing): run the sft stage first")
    printed = capsys.readouterr().out
    assert f"rlax launch: stage curate already done ({out}/curated/_SUCCESS); skipped" in printed
    assert "stage rft already done" in printed and "stage filter already done" in printed
    assert not (out / "rl").exists()


@pytest.mark.parametrize("overrides, said", [
    (["stages=[curate, rl]", "stage_overrides={}", "curate.inputs=[]"], "curate.inputs: the curate stage has no input"),
    (["stages=[curate, rft, rm, sft, rl]"], "rft.pairs_per_prompt: the rm stage trains on rft's preference pairs"),
    (["stages=[curate, rm, rl]", "stage_overrides={}"], "stages: rm has no data: list rft before rm, or set rm.data"),
    (["evaluate.eval_sets=[]"], "evaluate.eval_sets: the evaluate stage has no evaluation set"),
    (["model.upcycle={num_experts: 4, experts_per_token: 2}"], "model.upcycle: a staged run starts every stage from one policy"),
])
def test_a_plan_the_run_cannot_follow_is_refused_by_its_key(overrides, said, tmp_path):
    with pytest.raises(ConfigError) as error:
        plan(WARM, [f"run.output_dir={tmp_path}", *overrides])
    assert str(error.value).startswith(said) and "\n" not in str(error.value)


@pytest.mark.parametrize("argv, said", [
    (["--config", WARM, "stages=[curate, rft, bogus, rl]"], "stages: unknown stage 'bogus'"),
    (["--config", WARM, "--train-set", "x.jsonl"], "--train-set: a staged run trains on its own stages' prompts"),
    (["--config", "configs/quickstart.yaml", "--dry-run"], "--dry-run: prints a staged recipe's plan, and this "
                                                           "recipe names no stages"),
])
def test_the_launch_command_says_a_bad_staged_run_in_one_line(argv, said, tmp_path, capsys):
    assert main(["launch", *argv, "--output", str(tmp_path / "run")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlax launch: config error: ") and said in lines[0], lines


# ---------------------------------------------------------------- end to end, slow


def tiny_warm_overrides() -> list[str]:
    """configs/quickstart_warm.yaml at a size of minutes: a few prompts and samples per stage, 2 SFT
    and 2 RL steps (the RL stage's own sizes are its stage overrides: SFT reads the same trainer keys)."""
    return ["rft.limit=32", "rft.generation.sampling.samples_per_prompt=8",
            'stage_overrides.sft=["trainer.total_steps=2", "trainer.checkpoint_every=2"]', "sft.examples_per_step=4",
            "filter.limit=8", "filter.high=1.0", "filter.generation.sampling.samples_per_prompt=2",
            f"stage_overrides.rl={json.dumps(tiny_warm_overrides_rl())}", "evaluate.limit=4",
            "evaluate.generation.sampling.samples_per_prompt=2", "evaluate.ks=[1, 2]"]


def tiny_warm_overrides_rl() -> list[str]:
    from tests.support.tiny_launch import tiny_launch_overrides

    return tiny_launch_overrides(steps=2, checkpoint_every=1, wait_timeout_s=300, max_runtime_s=600)


def run_launch(output: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(REPO), XLA_FLAGS=env.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "").strip())
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "launch", "--config", WARM, "--output", str(output),
                           *tiny_warm_overrides(), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.slow
def test_the_warm_recipe_runs_stage_by_stage_and_a_rerun_skips_what_is_done(tmp_path):
    import jax
    import numpy as np

    from pipelines.runners import cached_prism_binary
    from rlax_core.models import from_pretrained
    from rlax_core.weights.store import WeightStore, WeightStoreConfig

    if cached_prism_binary() is None:
        pytest.skip("Prism not built: run `make setup`")
    out = tmp_path / "warm"
    done = run_launch(out)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    for name in ("curate", "rft", "sft", "filter", "rl", "evaluate"):
        assert f"rlax launch: stage {name} done in" in done.stdout
    assert (out / "curated" / "_SUCCESS").is_file() and (out / "rft" / "_SUCCESS").is_file()
    assert (out / "filtered" / "_SUCCESS").is_file() and (out / "rl" / "checkpoints" / "2" / "rlax_seal.json").is_file()
    # RL started from the SFT stage's final version: the RL run's version 0 is that export
    exported = from_pretrained(out / "sft" / "hf" / "step_00000002").params
    with WeightStore(WeightStoreConfig(root=str(out / "rl" / "weights"), run_id="quickstart_warm")) as store:
        version0 = store.load(0)
        assert store.latest() == 2
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), version0, exported)
    # the filter sampled the SFT export; evaluate scored the base, SFT's export and RL's final version
    assert json.loads((out / "filtered" / "stats.json").read_text())["model"] == str(out / "sft" / "hf" / "step_00000002")
    report = json.loads((out / "eval" / "report.json").read_text())
    assert sorted(report["models"]) == ["base", "rl", "sft"]

    (out / "eval" / "_SUCCESS").unlink()  # as if the run had stopped during evaluate
    again = run_launch(out, "--resume")
    assert again.returncode == 0, (again.stdout + again.stderr)[-5000:]
    for name in ("curate", "rft", "sft", "filter", "rl"):
        assert f"rlax launch: stage {name} already done" in again.stdout
    assert "rlax launch: stage evaluate done in" in again.stdout and (out / "eval" / "_SUCCESS").is_file()


@pytest.mark.slow
def test_a_reward_model_stage_pays_the_rl_stage(tmp_path):
    """curate -> rft (pairs) -> rm -> rl at a tiny size: RL is paid by the model the rm stage made."""
    from pipelines.runners import cached_prism_binary
    from rlax_core.utils.metrics import read_metrics

    if cached_prism_binary() is None:
        pytest.skip("Prism not built: run `make setup`")
    out = tmp_path / "learned"
    done = run_launch(out, "stages=[curate, rft, rm, rl]", "stage_overrides={}", "rft.pairs_per_prompt=2",
                      'stage_overrides.rm=["trainer.total_steps=2", "trainer.checkpoint_every=2"]',
                      "rm.pairs_per_step=4", "loop.rewards.terms={reward_model: 1.0, story_word: 0.0}",
                      "loop.rewards.reward_model={path: runs/x/reward_model, normalize: saved, max_length: 128}",
                      f"stage_overrides.rl={json.dumps(tiny_warm_overrides_rl())}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert (out / "rm" / "hf" / "step_00000002" / "reward_stats.json").is_file()
    rows = read_metrics(out / "rl" / "loop")
    assert [row["step"] for row in rows if "rollout/reward_model_mean" in row] == [0, 1]
