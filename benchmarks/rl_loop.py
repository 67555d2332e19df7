"""The online loop: synchronous vs bounded-asynchronous, and time to the quickstart's target vs TRL.

    python benchmarks/rl_loop.py [--steps 12] [--target-steps 30] [--eval-every 10] [--skip-trl]

Prints one JSON object:

* ``sync_vs_async``: the same run (stories260K, story task, 8 prompts x 8 samples) with k = 0 and
  k = 1: wall time per trainer step (median after the first, compile-heavy step), the trainer's
  idle fraction (time waiting for rollouts / time waiting + training), the step timeline (median
  seconds per hop from a publish to the trainer reading the rollouts it allowed,
  ``rlax_core.utils.timeline``), and both against the isolated GRPO step of
  ``benchmarks/train_step.py`` (``RlaxGrpo``) measured in the same run, in its own process, set up
  as the loop's trainer and rollout worker are (one device each, the recipe's KL term and
  ``trainer.max_seq_len``, layers unrolled, 4 rows per micro-batch); it generates all 64 tokens of
  every sample where the loop stops at a newline, so its generation is the heavier.
* ``time_to_target``: training wall time until held-out pass@1 reaches the quickstart's target,
  for RLAX (``rlax launch``, k = 1) and for TRL's GRPOTrainer on the same model (converted to a
  Hugging Face folder), reward (``story_word``), prompts, group size, learning rate and KL. Both
  are evaluated by the same evaluator (``rlax_core.tasks.evaluation``) every ``--eval-every``
  steps; evaluation time is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from pipelines.config import find_config  # noqa: E402
from pipelines.quickstart import HELDOUT_SAMPLES, QUICKSTART_RECIPE, TARGET_PASS_AT_1  # noqa: E402
from hf_stories import stories_hf_tokenizer  # noqa: E402

log = logging.getLogger("rl_loop")
QUICKSTART_CONFIG = find_config(QUICKSTART_RECIPE)
STOPS = "[1, 2, 13]"  # stories260K: BOS, EOS, newline


def _heldout():
    return [json.loads(line) for line in (REPO / "pipelines/assets/story_task/heldout.jsonl").read_text().splitlines()]


def _train_set(folder: Path) -> str:
    from rlax_core.tasks.story import story_examples, write_jsonl

    path = folder / "train.jsonl"
    write_jsonl(story_examples("train", 512, seed=0), path)
    return str(path)


def _run(folder: Path, steps: int, k: int, train_set: str, extra=()):
    from pipelines.launch import launch
    from pipelines.rl_stream import load_configs

    overrides = [f"run.output_dir={folder}", f"loop.stop_token_ids={STOPS}",
                 f"trainer.total_steps={steps}", f"trainer.max_staleness={k}", f"trainer.checkpoint_every={steps}",
                 *extra]
    started = time.time()
    where = launch(str(QUICKSTART_CONFIG), overrides, [], train_set=train_set, timeout_s=3600)
    run_config, _ = load_configs(str(QUICKSTART_CONFIG), overrides)
    return run_config, where, started


ISOLATED_STEP = """
import json, sys
sys.path[:0] = {paths!r}
import train_step
grpo = train_step.RlaxGrpo(warmup=2, kl_coef={kl_coef!r}, max_seq_len={max_seq_len!r})
grpo.run({steps})
print(json.dumps(grpo.result()))
"""


def isolated_step(steps: int) -> dict:
    """``benchmarks/train_step.py``'s GRPO step (``RlaxGrpo``) in a process of its own, set up as the
    quickstart recipe's trainer runs (see the module docstring); its ``result()``."""
    import subprocess

    from pipelines.rl_stream import load_configs

    run_config, _ = load_configs(str(QUICKSTART_CONFIG), [])
    code = ISOLATED_STEP.format(paths=[str(REPO), str(REPO / "benchmarks")], kl_coef=run_config.algorithm.kl_coef,
                                max_seq_len=run_config.trainer.max_seq_len, steps=steps)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the isolated GRPO step failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sync_vs_async(workdir: Path, steps: int, train_set: str, extra=(), isolated_steps: int = 8) -> dict:
    from rlax_core.utils.metrics import read_metrics
    from rlax_core.utils.timeline import median_hops, step_timeline
    from transforms.rollout import read_step_metrics

    isolated = isolated_step(isolated_steps)
    result = {"isolated_step": {"seconds_per_step": isolated["seconds_per_step"],
                                "generate_seconds": isolated["generate_seconds"],
                                "update_seconds": isolated["update_seconds"],
                                "setup": "benchmarks/train_step.py RlaxGrpo configured like the quickstart recipe's "
                                         "trainer (one device, its KL and max_seq_len, unrolled layers, "
                                         f"{isolated['update_micro_batches']} micro-batches); 64 forced new tokens",
                                "kl_coef": isolated["kl_coef"], "update_batch": isolated["update_batch"]},
              "loop_overrides": list(extra)}
    for k in (0, 1):
        run_config, _, _ = _run(workdir / f"k{k}", steps, k, train_set, extra)
        all_rows = read_metrics(Path(run_config.run.output_dir) / "metrics")
        rows = all_rows[1:]  # drop the compile-heavy first step
        times = [row["time"] for row in all_rows]
        waits = sum(row["train/wait_s"] for row in rows)
        busy = sum(row["train/step_s"] for row in rows)
        wall = statistics.median(b - a for a, b in zip(times[1:], times[2:]))
        # Schedule steps 0 and 1 are generated while the worker and trainer still compile: not steady state.
        timeline = [s for s in step_timeline(all_rows, read_step_metrics(run_config.rollout_root(), run_config.run.name))
                    if s["step"] >= 2]
        result[f"k={k}"] = {"step_wall_s_median": wall, "vs_isolated_step": wall / isolated["seconds_per_step"],
                            "trainer_idle_fraction": waits / (waits + busy), "steps_timed": len(rows) - 1,
                            "train_step_s_median": statistics.median(row["train/step_s"] for row in rows),
                            "timeline_median_s": {hop: None if v is None else round(v, 4)
                                                  for hop, v in median_hops(timeline).items()}}
    result["speedup_k1_over_k0"] = result["k=0"]["step_wall_s_median"] / result["k=1"]["step_wall_s_median"]
    return result


def _evaluate(model_config, params, base_params, tokenizer, engine):
    from rlax_core.rewards import RewardConfig
    from rlax_core.tasks.evaluation import evaluate_policy

    report = evaluate_policy(model_config, params, tokenizer, _heldout(), rewards=RewardConfig(terms={"story_word": 1.0}),
                             engine=engine, samples=HELDOUT_SAMPLES, stop_token_ids=(1, 2, 13), seed=1,
                             base_params=None, keep_texts=0)
    return {"pass@1": report["pass@1"], "pass@1_se": report["pass@1_se"]}


def rlax_time_to_target(workdir: Path, steps: int, every: int, train_set: str) -> dict:
    import jax

    from rlax_core.inference.config import EngineConfig
    from rlax_core.models import from_pretrained
    from rlax_core.models.tokenizer import load_tokenizer
    from rlax_core.utils.metrics import read_metrics
    from rlax_core.weights.store import WeightStore

    folder = workdir / "rlax"
    run_config, _, started = _run(folder, steps, 1, train_set,
                                  extra=[f"weights.root={folder}/weights", "weights.run_id=quickstart",
                                         f"weights.keep={steps + 1}", "weights.gc_grace_s=100000"])
    model_path = run_config.model.resolved_path()
    base, tokenizer = from_pretrained(model_path), load_tokenizer(model_path)
    times = {row["step"]: row["time"] for row in read_metrics(Path(run_config.run.output_dir) / "metrics")}
    first_step_start = min(times.values()) - 0.0
    curve = []
    with WeightStore(run_config.weight_store()) as store:
        for version in range(every, steps + 1, every):
            params = jax.tree.map(jax.numpy.asarray, store.load(version))
            point = {"step": version, "train_wall_s": times[version] - started,
                     **_evaluate(base.config, params, None, tokenizer, run_config.engine)}
            curve.append(point)
            log.info("rlax step %d: %s", version, point)
    del first_step_start
    return {"curve": curve, "time_to_target_s": next((p["train_wall_s"] for p in curve
                                                      if p["pass@1"] >= TARGET_PASS_AT_1), None)}


def trl_time_to_target(workdir: Path, steps: int, every: int, train_set: str) -> dict:
    """TRL's GRPOTrainer with the same model, reward, prompts, group size, learning rate and KL."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlax_core.inference.config import EngineConfig
    from rlax_core.models import from_pretrained, save_pretrained
    from rlax_core.models.tokenizer import load_tokenizer
    from rlax_core.rewards import RewardConfig, Rewarder
    from pipelines.config import load_run_config

    model_path = str(REPO / "pipelines/assets/stories260K")
    hf_dir = workdir / "trl" / "hf_model"
    base = from_pretrained(model_path)
    save_pretrained(base, hf_dir)
    tokenizer = stories_hf_tokenizer(str(Path(model_path) / "tok512.model"))
    prompts = [json.loads(line)["prompt"] for line in Path(train_set).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": p, "answer": "happy"} for p in prompts])
    rewarder = Rewarder(RewardConfig(terms={"story_word": 1.0}))

    def story_reward(prompts, completions, answer, **_):
        # TRL does not stop at a newline; the reward reads the first paragraph either way.
        return [rewarder({"answer": a}, c, "stop" if "\n" in c else "length")[0] for c, a in zip(completions, answer)]

    saved = []

    class SaveEvery(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every == 0:
                out = workdir / "trl" / f"step_{state.global_step}"
                model.save_pretrained(out, safe_serialization=True)
                saved.append((state.global_step, time.time(), out))

    config = GRPOConfig(output_dir=str(workdir / "trl" / "out"), learning_rate=3e-4, beta=0.04, num_generations=8,
                        per_device_train_batch_size=64, gradient_accumulation_steps=1, max_completion_length=64,
                        temperature=1.0, max_steps=steps, logging_steps=1, save_strategy="no", report_to=[],
                        use_cpu=True, seed=0, lr_scheduler_type="constant", max_grad_norm=1.0)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=story_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[SaveEvery()])
    started = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # transformers prints its logs; stdout is for the JSON result
        trainer.train()
    run_config = load_run_config(str(QUICKSTART_CONFIG), [])
    rlax_tokenizer = load_tokenizer(model_path)
    curve = []
    for step, wall, out in saved:
        params = from_pretrained(str(out)).params
        curve.append({"step": step, "train_wall_s": wall - started,
                      **_evaluate(base.config, params, None, rlax_tokenizer, run_config.engine)})
        log.info("trl step %d: %s", step, curve[-1])
    return {"curve": curve, "time_to_target_s": next((p["train_wall_s"] for p in curve
                                                      if p["pass@1"] >= TARGET_PASS_AT_1), None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="steps of the sync vs k=1 runs")
    parser.add_argument("--target-steps", type=int, default=30, help="steps of the time-to-target runs")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-sync", action="store_true")
    parser.add_argument("--skip-target", action="store_true", help="only the sync vs k=1 comparison")
    parser.add_argument("--isolated-steps", type=int, default=8, help="timed steps of the isolated GRPO step")
    parser.add_argument("--loop-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra recipe override for the sync vs k=1 runs (repeatable)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="rl_loop_"))
    try:
        train_set = _train_set(workdir)
        result: dict = {"target_pass@1": TARGET_PASS_AT_1, "heldout_prompts": len(_heldout()),
                        "samples_per_prompt": HELDOUT_SAMPLES}
        if not args.skip_sync:
            result["sync_vs_async"] = sync_vs_async(workdir, args.steps, train_set, args.loop_override,
                                                    args.isolated_steps)
        if args.skip_target:
            print(json.dumps(result, indent=2))
            return
        rlax = rlax_time_to_target(workdir, args.target_steps, args.eval_every, train_set)
        result["time_to_target"] = {"rlax": rlax}
        if not args.skip_trl:
            trl = trl_time_to_target(workdir, args.target_steps, args.eval_every, train_set)
            result["time_to_target"]["trl"] = trl
            if rlax["time_to_target_s"] and trl["time_to_target_s"]:
                result["time_to_target"]["speedup_rlax_over_trl"] = trl["time_to_target_s"] / rlax["time_to_target_s"]
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
