"""Does an online curriculum reach the target sooner? ``uniform`` against ``balanced`` (and optionally
``difficulty_pools``) on the quickstart's story task, same model, steps and seeds.

    python benchmarks/curriculum.py [--steps 12] [--eval-every 2] [--seeds 0 1 2] [--train-prompts 512]
                                    [--kinds uniform balanced] [--set KEY=VALUE ...]

Each run is ``rlax launch`` of ``configs/quickstart.yaml`` (stories260K, 8 prompts x 8 samples per
step, k = 1) with ``loop.curriculum.kind`` set, trained ``--steps`` steps; every ``--eval-every``-th
weight version is scored afterwards by the quickstart's held-out evaluation (``benchmarks/rl_curves``:
64 prompts x 8 samples), so evaluation costs no training time.

Prints one JSON object: per kind ``steps_to_target`` (the first evaluated step at or above the
quickstart's target pass@1, per seed and their mean; a seed that never reaches it counts as
``--steps`` in the mean and is named in ``not_reached``), ``final_pass_at_1`` at the last step (mean
over seeds), ``generated_tokens`` (completion tokens the rollouts spent, from the rollout store's
step metrics) and ``dropped_group_share`` (groups whose rewards were all equal: what DAPO's dynamic
sampling drops; the quickstart's grpo trains on them for nothing), then each kind's
``steps_ratio_vs_uniform`` and whether it meets the issue's bar of 0.75x. The machine's load average
is printed with it: on a shared machine a run is a loaded run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import rl_curves  # noqa: E402  (the quickstart's launch and evaluation, shared with benchmarks/rl_curves.py)
from pipelines.quickstart import TARGET_PASS_AT_1  # noqa: E402

log = logging.getLogger("curriculum")
BAR = 0.75  # the bar: the curriculum reaches the target in at most 0.75x uniform's steps


def spend(run_config, steps: int, k: int = 1) -> dict:
    """Completion tokens the rollouts generated, and the share of groups whose task rewards were all
    equal (written ones, and those dynamic sampling dropped when a run turns it on: their scores are kept)."""
    from rlax_core.data.rollout_store import RolloutStore

    store = RolloutStore(run_config.rollout_root(), run_config.run.name)
    tokens, groups, uniform, settled, informed = 0, 0, 0, 0, 0
    scored_at: dict[str, int] = {}  # prompt -> first step whose group scored it
    for key in store.list_groups():
        rows = store.read_group(key).select(["example_id", "completion_ids", "reward_info", "reward"]).to_pylist()
        first = scored_at.setdefault(rows[0]["example_id"], key.step)
        informed += first <= key.step - k - 1  # the draw's state held a score of this prompt
        infos = [json.loads(r["reward_info"]) for r in rows]
        tokens += sum(len(r["completion_ids"]) for r in rows)
        groups += 1
        uniform += len({info.get("task_reward", r["reward"]) for info, r in zip(infos, rows)}) == 1
        settled += len({bool(info.get("pass", False)) for info in infos}) == 1
    dropped = sum(len(store.read_dropped_scores(step)) for step in range(steps + 1))
    total = groups + dropped
    # The story reward is not binary (fluency terms): groups whose samples all passed or all failed
    # carry no pass/fail signal even where their rewards differ; that share is printed beside.
    return {"generated_tokens": tokens, "dropped_group_share": (uniform + dropped) / total if total else None,
            "all_pass_or_all_fail_share": (settled + dropped) / total if total else None,
            # Draws a curriculum could inform: the prompt had a scored group in steps <= s - k - 1.
            "draws_of_scored_prompts_share": informed / groups if groups else None}


def train_set(folder: Path, count: int) -> str:
    """The quickstart's story prompts (``benchmarks/rl_curves.train_set`` at 512), ``count`` of them."""
    from rlax_core.tasks.story import story_examples, write_jsonl

    path = folder / "train.jsonl"
    write_jsonl(story_examples("train", count, seed=0), path)
    return str(path)


def run_kind(workdir: Path, kind: str, seed: int, steps: int, every: int, train_path: str, extra) -> dict:
    folder = workdir / f"{kind}_s{seed}"
    curve = rl_curves.rlax_curve(folder, steps, every, 1, train_path, seed, [f"loop.curriculum.kind={kind}", *extra])
    from pipelines.rl_stream import load_configs

    run_config, _ = load_configs(str(rl_curves.QUICKSTART_CONFIG), [f"run.output_dir={folder}"])
    reached = next((p["step"] for p in curve if p["step"] > 0 and p["pass@1"] >= TARGET_PASS_AT_1), None)
    return {"curve": curve, "steps_to_target": reached, "final_pass_at_1": curve[-1]["pass@1"], **spend(run_config, steps)}


def summarize(runs: dict[str, dict[int, dict]], steps: int) -> dict:
    out = {}
    for kind, by_seed in runs.items():
        reached = {seed: r["steps_to_target"] for seed, r in by_seed.items()}
        counted = [s if s is not None else steps for s in reached.values()]
        out[kind] = {
            "steps_to_target": {"mean": sum(counted) / len(counted), "per_seed": reached,
                                "not_reached": [seed for seed, s in reached.items() if s is None]},
            "final_pass_at_1": {"mean": round(sum(r["final_pass_at_1"] for r in by_seed.values()) / len(by_seed), 4),
                                "per_seed": {seed: r["final_pass_at_1"] for seed, r in by_seed.items()}},
            "generated_tokens": {"mean": sum(r["generated_tokens"] for r in by_seed.values()) / len(by_seed),
                                 "per_seed": {seed: r["generated_tokens"] for seed, r in by_seed.items()}},
            "dropped_group_share": {"mean": round(sum(r["dropped_group_share"] or 0 for r in by_seed.values())
                                                  / len(by_seed), 4),
                                    "per_seed": {seed: r["dropped_group_share"] for seed, r in by_seed.items()}},
            "all_pass_or_all_fail_share": {
                "mean": round(sum(r["all_pass_or_all_fail_share"] or 0 for r in by_seed.values()) / len(by_seed), 4),
                "per_seed": {seed: r["all_pass_or_all_fail_share"] for seed, r in by_seed.items()}},
            "draws_of_scored_prompts_share": {
                "mean": round(sum(r["draws_of_scored_prompts_share"] or 0 for r in by_seed.values()) / len(by_seed), 4),
                "per_seed": {seed: r["draws_of_scored_prompts_share"] for seed, r in by_seed.items()}},
            "curves": {seed: r["curve"] for seed, r in by_seed.items()},
        }
    if "uniform" in out:
        base = out["uniform"]["steps_to_target"]["mean"]
        for kind, row in out.items():
            ratio = row["steps_to_target"]["mean"] / base if base else None
            row["steps_ratio_vs_uniform"] = None if ratio is None else round(ratio, 3)
            row["meets_0_75x"] = ratio is not None and ratio <= BAR
            if kind != "uniform" and not row["meets_0_75x"]:
                row["verdict"] = (
                    f"does not reach the target in {BAR}x uniform's steps ({row['steps_ratio_vs_uniform']}x); "
                    f"{row['draws_of_scored_prompts_share']['mean']:.0%} of its draws were of prompts the loop had "
                    "scored (unscored ones weigh alike), and the story task's prompts differ little in difficulty: "
                    "every one asks for the same word, so a prompt's pass rate says little about the next draw")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kinds", nargs="+", default=["uniform", "balanced"])
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run (loop.curriculum.*)")
    parser.add_argument("--train-prompts", type=int, default=512,
                        help="training prompts (the quickstart's 512; fewer: each is drawn, scored and weighed more often)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="curriculum_bench_"))
    load_before = os.getloadavg()
    try:
        path = train_set(workdir, args.train_prompts)
        runs: dict[str, dict[int, dict]] = {}
        for seed in args.seeds:
            for kind in args.kinds:
                runs.setdefault(kind, {})[seed] = run_kind(workdir, kind, seed, args.steps, args.eval_every, path,
                                                           args.set)
                log.info("%s seed %d: %s", kind, seed, {k: v for k, v in runs[kind][seed].items() if k != "curve"})
        result = {"target_pass@1": TARGET_PASS_AT_1, "steps": args.steps, "train_prompts": args.train_prompts, "eval_every": args.eval_every,
                  "seeds": args.seeds, "overrides": args.set, "bar": f"at most {BAR}x uniform's steps to target",
                  "load_average": {"before": load_before, "after": os.getloadavg()},
                  "kinds": summarize(runs, args.steps)}
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
