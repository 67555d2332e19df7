"""Does a warm start (RFT -> SFT before RL) reach the target sooner than RL from the base model?

    python benchmarks/warm_start.py [--seeds 0 1 2] [--steps 30] [--curve-every 5] [--filter-prompts 256]

Each seed is one ``rlax quickstart --config configs/quickstart_warm.yaml`` with ``run.seed`` and
``trainer.seed`` set to it: stories260K makes RFT data on the story task's training prompts, SFT
trains on it, RL starts from the SFT job's final version (``warm``), and the plain quickstart's RL
runs beside it from the base model on the same prompts, steps and seed (``cold``). Every
``--curve-every``-th weight version of both is scored on the 64 held-out prompts x 8 samples after
training (``pipelines.quickstart_stages.curves``).

Prints one JSON object: ``cold`` and ``warm``, each with ``steps_to_target`` (the first evaluated RL
step at or above the target pass@1, ``--target`` or the quickstart's; 0: the starting policy already is; a seed that never
reaches it counts as ``--steps`` in the mean and is named in ``not_reached``) and
``final_pass_at_1`` (after ``--steps``), as the mean over seeds with its spread (sample standard
deviation, min, max) and per seed; ``sft_seconds`` (the SFT stage: ``rlax sft`` start to end) and
``rft_seconds``; the SFT policy's pass@1 and the held-out NLL of held-out verified samples before and
after SFT; and the machine's load average before and after (a shared machine's run is a loaded run).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

log = logging.getLogger("warm_start")


def spread(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4),
            "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def run_seed(workdir: Path, seed: int, args) -> dict:
    """One warm quickstart (with its cold run beside it); returns its report."""
    output = workdir / f"seed_{seed}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "pipelines.cli", "quickstart", "--config", "configs/quickstart_warm.yaml",
               "--output", str(output), "--filter-prompts", str(args.filter_prompts),
               "--curve-every", str(args.curve_every), f"run.seed={seed}", f"trainer.seed={seed}",
               f"trainer.total_steps={args.steps}", *args.set]
    done = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    if done.returncode != 0:
        raise SystemExit(f"warm_start: seed {seed} failed (exit {done.returncode}); its logs: {output}/logs")
    return json.loads((output / "report.json").read_text())


def summarize(reports: dict[int, dict], steps: int, target: float) -> dict:
    out = {}
    for variant in ("cold", "warm"):
        # From the curves, so a target other than the report's can be asked (SFT alone may pass 0.25)
        reached = {seed: next((p["step"] for p in r[variant]["curve"] if p["pass@1"] >= target), None)
                   for seed, r in reports.items()}
        final = {seed: r[variant]["final_pass_at_1"] for seed, r in reports.items()}
        out[variant] = {
            "steps_to_target": {**spread([s if s is not None else steps for s in reached.values()]),
                                "per_seed": reached, "not_reached": [s for s, v in reached.items() if v is None]},
            "final_pass_at_1": {**spread(list(final.values())), "per_seed": final},
            "curves": {seed: r[variant]["curve"] for seed, r in reports.items()},
        }
    out["sft_seconds"] = {**spread([r["seconds"]["sft"] for r in reports.values()]),
                          "per_seed": {s: round(r["seconds"]["sft"], 1) for s, r in reports.items()}}
    out["rft_seconds"] = spread([r["seconds"]["rft"] for r in reports.values()])
    out["base_pass_at_1"] = spread([r["before"]["pass@1"] for r in reports.values()])
    out["sft_pass_at_1"] = spread([r["sft"]["pass@1"] for r in reports.values()])
    out["heldout_nll_before_sft"] = spread([r["sft"]["heldout_nll_before"] for r in reports.values()])
    out["heldout_nll_after_sft"] = spread([r["sft"]["heldout_nll_after"] for r in reports.values()])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="RL steps of each run (the quickstart's 30)")
    parser.add_argument("--curve-every", type=int, default=5)
    parser.add_argument("--filter-prompts", type=int, default=256)
    parser.add_argument("--target", type=float, help="the pass@1 to reach (default: the quickstart's)")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--keep", help="keep the runs in this folder (default: a temporary one, removed)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from pipelines.quickstart import TARGET_PASS_AT_1

    target = TARGET_PASS_AT_1 if args.target is None else args.target
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="warm_start_bench_"))
    load_before = os.getloadavg()
    try:
        reports = {}
        for seed in args.seeds:
            reports[seed] = run_seed(workdir, seed, args)
            log.info("seed %d: cold %s, warm %s", seed, reports[seed]["cold"]["steps_to_target"],
                     reports[seed]["warm"]["steps_to_target"])
        result = {"target_pass@1": target, "steps": args.steps, "curve_every": args.curve_every,
                  "seeds": args.seeds, "overrides": args.set,
                  "load_average": {"before": load_before, "after": os.getloadavg()}, **summarize(reports, args.steps, target)}
        print(json.dumps(result, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
