"""The online loop: synchronous vs bounded-asynchronous, and time to the quickstart's target vs TRL.

    python benchmarks/rl_loop.py [--steps 12] [--target-steps 30] [--eval-every 2] [--skip-trl]

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
* ``time_to_target``: wall time, start-up included, until held-out pass@1 reaches the quickstart's
  target, for RLAX (``rlax launch``, k = 1 as the quickstart runs; from the call of ``launch``)
  and for TRL's GRPOTrainer (from before its model is loaded and the trainer built) on the same
  model, reward, prompts, group size and hyper-parameters (``benchmarks/rl_curves.py``), and their
  ratio; both evaluated every ``--eval-every`` steps (2) from saved weights after the run, by the
  same evaluator (evaluation time not counted); a k = 0 RLAX curve beside them, and held-out
  pass@1 +- its standard error of all three at equal steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import rl_curves  # noqa: E402
from pipelines.quickstart import HELDOUT_SAMPLES, TARGET_PASS_AT_1  # noqa: E402

log = logging.getLogger("rl_loop")
QUICKSTART_CONFIG = rl_curves.QUICKSTART_CONFIG


def _run(folder: Path, steps: int, k: int, train_set: str, extra=()):
    return rl_curves.launch_rlax(folder, steps, k, train_set, extra)


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
    from rlax_core.data.rollout_store import RolloutStore

    import os

    load_before = os.getloadavg()[0]
    # Before and after the loop's runs, so that a change in the machine's load during the run hits both.
    before = isolated_step(isolated_steps)
    loops = {}
    for k in (0, 1):
        loops[k] = _run(workdir / f"k{k}", steps, k, train_set, extra)[0]
    after = isolated_step(isolated_steps)
    isolated = {key: (before[key] + after[key]) / 2 for key in ("seconds_per_step", "generate_seconds", "update_seconds")}
    result = {"isolated_step": {**isolated, "seconds_per_step_before_and_after": [before["seconds_per_step"],
                                                                                  after["seconds_per_step"]],
                                "setup": "benchmarks/train_step.py RlaxGrpo configured like the quickstart recipe's "
                                         "trainer (one device, its KL and max_seq_len, unrolled layers, "
                                         f"{before['update_micro_batches']} micro-batches); 64 forced new tokens",
                                "kl_coef": before["kl_coef"], "update_batch": before["update_batch"]},
              "loop_overrides": list(extra),
              "load_average_1min_before_and_after": [load_before, os.getloadavg()[0]]}
    for k, run_config in loops.items():
        all_rows = read_metrics(Path(run_config.run.output_dir) / "metrics")
        rows = all_rows[1:]  # drop the compile-heavy first step
        times = [row["time"] for row in all_rows]
        waits = sum(row["train/wait_s"] for row in rows)
        busy = sum(row["train/step_s"] for row in rows)
        wall = statistics.median(b - a for a, b in zip(times[1:], times[2:]))
        # Schedule steps 0 and 1 are generated while the worker and trainer still compile: not steady state.
        rollout_rows = RolloutStore(run_config.rollout_root(), run_config.run.name).read_step_metrics()
        timeline = [s for s in step_timeline(all_rows, rollout_rows) if s["step"] >= 2]
        result[f"k={k}"] = {"step_wall_s_median": wall, "vs_isolated_step": wall / isolated["seconds_per_step"],
                            "trainer_idle_fraction": waits / (waits + busy), "steps_timed": len(rows) - 1,
                            "train_step_s_median": statistics.median(row["train/step_s"] for row in rows),
                            "timeline_median_s": {hop: None if v is None else round(v, 4)
                                                  for hop, v in median_hops(timeline).items()}}
    result["speedup_k1_over_k0"] = result["k=0"]["step_wall_s_median"] / result["k=1"]["step_wall_s_median"]
    return result


def time_to_target(workdir: Path, steps: int, every: int, train_set: str, skip_trl: bool) -> dict:
    """RLAX at k = 1 (as the quickstart runs) and k = 0, and TRL: curves, and the wall time to the target."""
    result: dict = {}
    for name, k in (("rlax", 1), ("rlax_k0", 0)):
        curve = rl_curves.rlax_curve(workdir / name, steps, every, k, train_set)
        result[name] = {"curve": curve, "time_to_target_s": rl_curves.time_to_target(curve)}
    if not skip_trl:
        curve = rl_curves.trl_curve(workdir / "trl", steps, every, train_set)
        result["trl"] = {"curve": curve, "time_to_target_s": rl_curves.time_to_target(curve)}
        rlax_s, trl_s = result["rlax"]["time_to_target_s"], result["trl"]["time_to_target_s"]
        if rlax_s and trl_s:
            result["speedup_rlax_over_trl"] = trl_s / rlax_s
        by_step = {name: {p["step"]: p for p in run["curve"]} for name, run in result.items() if isinstance(run, dict)}
        result["pass@1_at_equal_steps"] = [
            {"step": step, **{name: f"{points[step]['pass@1']:.3f} +- {points[step]['pass@1_se']:.3f}"
                              for name, points in by_step.items()}}
            for step in sorted(by_step["rlax"])]
        result["settings"] = rl_curves.settings()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="steps of the sync vs k=1 runs")
    parser.add_argument("--target-steps", type=int, default=30, help="steps of the time-to-target runs")
    parser.add_argument("--eval-every", type=int, default=2)
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
        train_set = rl_curves.train_set(workdir)
        result: dict = {"target_pass@1": TARGET_PASS_AT_1, "heldout_prompts": len(rl_curves.heldout()),
                        "samples_per_prompt": HELDOUT_SAMPLES}
        if not args.skip_sync:
            result["sync_vs_async"] = sync_vs_async(workdir, args.steps, train_set, args.loop_override,
                                                    args.isolated_steps)
        if args.skip_target:
            print(json.dumps(result, indent=2))
            return
        result["time_to_target"] = time_to_target(workdir, args.target_steps, args.eval_every, train_set,
                                                   args.skip_trl)
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
