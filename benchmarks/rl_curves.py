"""Learning per step: held-out pass@1 curves of RLAX (``rlax launch``) and TRL's GRPOTrainer.

    python benchmarks/rl_curves.py [--steps 30] [--eval-every 2] [--seeds 0 1] [--k 0 1] [--skip-trl]
                                   [--set algorithm.loss_aggregation=token_mean ...]

Both train stories260K on the quickstart recipe's story task (reward ``story_word``, 8 prompts x 8
samples per step, learning rate, KL, clipping and optimizer of ``configs/quickstart.yaml``) from the
same 512 training prompts; TRL gets the model converted to a Hugging Face folder. Every
``--eval-every`` steps the weights are saved (RLAX: its weight store keeps every version; TRL: a
callback), and after the run each saved point is scored by the same evaluator
(``rlax_core.eval.policy``: the 64 held-out prompts x 8 samples, stopping at a newline), so
evaluation costs no training time. Wall times count start-up: RLAX from the call of ``launch``,
TRL from before the model is loaded and the trainer built (the time its callback spends saving is
taken off). ``time_to_target`` uses these curves (``benchmarks/rl_loop.py``).

Prints one JSON object: per run (``rlax_k0``, ``rlax_k1``, ``trl``) and seed the curve
``[{step, train_wall_s, pass@1, pass@1_se}]``, and per run the mean pass@1 over seeds at each step
with its standard error (the seeds' spread and each evaluation's own standard error together).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import baselines  # noqa: E402  (the baselines' fair settings)
from pipelines.config import find_config, load_run_config  # noqa: E402
from pipelines.quickstart import HELDOUT_SAMPLES, QUICKSTART_RECIPE, TARGET_PASS_AT_1  # noqa: E402

log = logging.getLogger("rl_curves")
QUICKSTART_CONFIG = find_config(QUICKSTART_RECIPE)
STOP_TOKEN_IDS = (1, 2, 13)  # stories260K: BOS, EOS, newline
MODEL_PATH = REPO / "pipelines/assets/stories260K"


def heldout() -> list[dict]:
    return [json.loads(line) for line in (REPO / "pipelines/assets/story_task/heldout.jsonl").read_text().splitlines()]


def train_set(folder: Path) -> str:
    from rlax_core.tasks.story import story_examples, write_jsonl

    path = folder / "train.jsonl"
    write_jsonl(story_examples("train", 512, seed=0), path)
    return str(path)


def launch_rlax(folder: Path, steps: int, k: int, train_path: str, extra=()):
    """``rlax launch`` of the quickstart recipe; returns (run config, where, the time launch was called)."""
    from pipelines.launch import launch
    from pipelines.rl_stream import load_configs

    overrides = [f"run.output_dir={folder}", f"loop.sampling.stop_token_ids=[{', '.join(map(str, STOP_TOKEN_IDS))}]",
                 f"trainer.total_steps={steps}", f"trainer.max_staleness={k}", f"trainer.checkpoint_every={steps}",
                 *extra]
    started = time.time()
    where = launch(str(QUICKSTART_CONFIG), overrides, [], train_set=train_path, timeout_s=3600)
    run_config, _ = load_configs(str(QUICKSTART_CONFIG), overrides)
    return run_config, where, started


def evaluate(params, engine_config=None) -> dict:
    """Held-out pass@1 (and its standard error) of ``params``: the quickstart's evaluation, seed 1."""
    from rlax_core.models import from_pretrained
    from rlax_core.models.tokenizer import load_tokenizer
    from rlax_core.rewards import RewardConfig
    from rlax_core.eval.policy import evaluate_policy

    engine_config = engine_config or load_run_config(str(QUICKSTART_CONFIG), []).engine
    model_config = from_pretrained(str(MODEL_PATH)).config
    report = evaluate_policy(model_config, params, load_tokenizer(str(MODEL_PATH)), heldout(),
                             rewards=RewardConfig(terms={"story_word": 1.0}), engine=engine_config,
                             samples=HELDOUT_SAMPLES, stop_token_ids=STOP_TOKEN_IDS, seed=1, keep_texts=0)
    return {"pass@1": report["pass@1"], "pass@1_se": report["pass@1_se"]}


def rlax_curve(folder: Path, steps: int, every: int, k: int, train_path: str, seed: int = 0, extra=()) -> list[dict]:
    """Train ``steps`` steps at staleness ``k``; evaluate every ``every``-th weight version (and version 0)."""
    import jax

    from rlax_core.utils.metrics import read_metrics
    from rlax_core.weights.store import WeightStore

    run_config, _, started = launch_rlax(
        folder, steps, k, train_path,
        extra=[f"run.seed={seed}", f"trainer.seed={seed}", f"weights.root={folder}/weights",
               "weights.run_id=curve", f"weights.keep={steps + 1}", "weights.gc_grace_s=100000", *extra])
    ended = {row["step"]: row["time"] for row in read_metrics(Path(run_config.run.output_dir) / "metrics")}
    curve = []
    with WeightStore(run_config.weight_store()) as store:
        for version in range(0, steps + 1, every):
            params = jax.tree.map(jax.numpy.asarray, store.load(version))
            wall = ended[version] - started if version else None
            curve.append({"step": version, "train_wall_s": wall, **evaluate(params, run_config.engine)})
            log.info("rlax k=%d seed %d step %d: %s", k, seed, version, curve[-1])
    return curve


# RLAX's loss aggregation -> TRL's loss_type with the same token weights (TRL's "grpo" divides each
# sequence by its own length, "dapo" every token by the batch's token count, "dr_grpo" by a constant).
TRL_LOSS_TYPE = {"seq_mean_token_mean": "grpo", "token_mean": "dapo", "seq_sum_norm": "dr_grpo"}


def trl_grpo_options(recipe, output_dir: str, steps: int, seed: int = 0) -> dict:
    """GRPOConfig's keywords: the recipe's hyper-parameters, run as RLAX runs them
    (``baselines.TRL_GRPO_FAIR``: float32, no activation checkpointing)."""
    optimizer, algorithm = recipe.trainer.optimizer, recipe.algorithm
    groups, samples = recipe.trainer.groups_per_step, recipe.loop.sampling.samples_per_prompt
    return dict(
        output_dir=output_dir, learning_rate=optimizer.learning_rate, beta=algorithm.kl_coef,
        epsilon=algorithm.clip_eps_low, epsilon_high=algorithm.clip_eps_high, num_generations=samples,
        loss_type=TRL_LOSS_TYPE[algorithm.loss_aggregation], scale_rewards="group",
        per_device_train_batch_size=groups * samples, gradient_accumulation_steps=1,
        max_completion_length=recipe.loop.sampling.budget(recipe.engine), temperature=recipe.loop.sampling.temperature,
        lr_scheduler_type=optimizer.schedule, warmup_steps=optimizer.warmup_steps, max_grad_norm=optimizer.max_grad_norm,
        adam_beta1=optimizer.b1, adam_beta2=optimizer.b2, adam_epsilon=optimizer.eps, weight_decay=optimizer.weight_decay,
        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], seed=seed, **baselines.TRL_GRPO_FAIR)


def settings(extra=()) -> dict:
    """Each side's dtype and recomputation as the JSON prints them: RLAX's recipe, TRL's options."""
    recipe = load_run_config(str(QUICKSTART_CONFIG), list(extra))
    return {"rlax": baselines.rlax_precision(recipe.trainer),
            "trl": baselines.trl_settings(trl_grpo_options(recipe, "unused", 1))}


def trl_curve(folder: Path, steps: int, every: int, train_path: str, seed: int = 0, extra=()) -> list[dict]:
    """TRL's GRPOTrainer on the same model, reward, prompts and hyper-parameters (the recipe with the
    RLAX runs' ``extra`` overrides); evaluated like RLAX."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hf_stories import stories_hf_tokenizer
    from rlax_core.models import from_pretrained, save_pretrained
    from rlax_core.rewards import RewardConfig, Rewarder

    recipe = load_run_config(str(QUICKSTART_CONFIG), list(extra))
    baselines.setup_torch()
    hf_dir = folder / "hf_model"
    save_pretrained(from_pretrained(str(MODEL_PATH)), hf_dir)  # the user's starting point: not timed
    tokenizer = stories_hf_tokenizer(str(MODEL_PATH / "tok512.model"))
    prompts = [json.loads(line)["prompt"] for line in Path(train_path).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": p, "answer": "happy"} for p in prompts])
    rewarder = Rewarder(RewardConfig(terms={"story_word": 1.0}))

    def story_reward(prompts, completions, answer, **_):
        # TRL does not stop at a newline; the reward reads the first paragraph either way.
        return [rewarder({"answer": a}, c, "stop" if "\n" in c else "length")[0] for c, a in zip(completions, answer)]

    saved, saving_s = [], [0.0]

    class SaveEvery(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every == 0:
                began = time.time()
                out = folder / f"step_{state.global_step}"
                model.save_pretrained(out, safe_serialization=True)
                saved.append((state.global_step, began - saving_s[0], out))
                saving_s[0] += time.time() - began

    config = GRPOConfig(**trl_grpo_options(recipe, str(folder / "out"), steps, seed))
    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(hf_dir, **baselines.load_options())
    trainer = GRPOTrainer(model=model, reward_funcs=story_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[SaveEvery()])
    with contextlib.redirect_stdout(sys.stderr):  # transformers prints its logs; stdout is for the JSON result
        trainer.train()
    curve = [{"step": 0, "train_wall_s": None, **evaluate(from_pretrained(str(hf_dir)).params)}]
    for step, wall, out in saved:
        curve.append({"step": step, "train_wall_s": wall - started, **evaluate(from_pretrained(str(out)).params)})
        log.info("trl seed %d step %d: %s", seed, step, curve[-1])
    return curve


def time_to_target(curve: list[dict]) -> float | None:
    """Training wall time (start-up included) of the first evaluated step at or above the target."""
    return next((p["train_wall_s"] for p in curve if p["step"] > 0 and p["pass@1"] >= TARGET_PASS_AT_1), None)


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """pass@1 averaged over seeds per step; se = sqrt(seeds' variance / n + mean evaluation se^2 / n)."""
    rows = []
    for points in zip(*curves):
        values = [p["pass@1"] for p in points]
        n = len(values)
        mean = sum(values) / n
        spread = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        eval_var = sum(p["pass@1_se"] ** 2 for p in points) / n
        rows.append({"step": points[0]["step"], "pass@1": round(mean, 4),
                     "se": round(math.sqrt(spread / n + eval_var / n), 4), "seeds": n})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--k", type=int, nargs="*", default=[0, 1], help="RLAX staleness bounds to run")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--set", nargs="*", default=[], help="extra RLAX overrides (algorithm.loss_aggregation=...)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="rl_curves_"))
    try:
        path = train_set(workdir)
        runs: dict[str, dict] = {}
        for seed in args.seeds:
            for k in args.k:
                curve = rlax_curve(workdir / f"k{k}_s{seed}", args.steps, args.eval_every, k, path, seed, args.set)
                runs.setdefault(f"rlax_k{k}", {})[seed] = curve
            if not args.skip_trl:
                runs.setdefault("trl", {})[seed] = trl_curve(workdir / f"trl_s{seed}", args.steps, args.eval_every,
                                                             path, seed, args.set)
        result = {"overrides": args.set, "target_pass@1": TARGET_PASS_AT_1, "settings": settings(args.set),
                  "runs": {name: {"seeds": by_seed, "mean": mean_curve(list(by_seed.values())),
                                  "time_to_target_s": {s: time_to_target(c) for s, c in by_seed.items()}}
                           for name, by_seed in runs.items()}}
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
