"""The fleet simulator (``rlax_core.fleet.simulate``) calibrated on this machine, and its table for 1 to 1,024 workers.

Inputs, all measured:

* generation cost per token: from ``benchmarks/rollout_scaling.py``'s 1-worker run (its JSON,
  ``--scaling``): one worker's steady groups/s and tokens per group give seconds per token (scoring
  and writing a group fold into that cost);
* weight-sync time: measured here, publishing the quickstart model (stories260K) to a weight store
  and loading it in a fresh reader, the path a rollout worker takes to a new version;
* trainer step time: ``--trainer-s-per-group`` (default: 0.15 s for the quickstart's 8-group GRPO
  update, docs/training.md), scaled by the step's groups.

Calibration: the simulator, given the 1-worker cost, predicts the benchmark's own setting (every
step allowed at once, no trainer in the way) for 1 and 2 workers; the relative error against the
measured groups/s says how far "workers do not slow each other down" holds on this host.

Then the table: ``--groups-per-step`` groups per step (default 512, the 1,024-chip recipe's step),
for 1, 8, 64 and 1,024 workers at k = 0, 1, 2: rollout groups/s, trainer idle fraction, workers'
busy fraction and the staleness histogram.

    python benchmarks/rollout_scaling.py > scaling.json
    python benchmarks/fleet_sim.py --scaling scaling.json [--markdown]
    python benchmarks/fleet_sim.py                  # runs rollout_scaling.py itself first

Prints one JSON object (and, with ``--markdown``, the table as Markdown after it).

With ``--compiled`` it predicts a production recipe's fleet from its compiled programs instead
(``pipelines/fleet.py``, ``rlax_core/fleet/compiled.py``): per-chip decode, prefill and update
seconds from ``rlax compile --json``'s cost analysis, the weight sync from bytes over the host
network, the mean prompt and completion lengths assumed. The baseline beside it, in the same run,
is the same fleet with k = 0:

    .venv-tpu/bin/rlax compile --config configs/qwq32b_code_tpu_1024.yaml --json runs/compile-qwq32b.json
    python benchmarks/fleet_sim.py --compiled runs/compile-qwq32b.json [--completion-fraction 0.5] [--markdown]

With ``--rows`` it prints one row per configuration, each a comma-separated set of reports (the
rollout's decode and the trainer's update of one configuration: pages on demand, packed trainer,
the engine's dtypes), the way docs/fleet.md's tables are made:

    python benchmarks/fleet_sim.py --rows runs/compile-qwq32b-v5p-bf16.json,runs/compile-qwq32b-trainer.json \
        runs/compile-qwq32b-v5p-int8.json,runs/compile-qwq32b-trainer.json --markdown

A row whose first report compiled a reward model on a stage of its own (``rlax compile --roles
reward_model`` with ``loop.rewards.reward_model.placement=own_stage``) simulates that scoring stage
between rollout and trainer; the rows then print as the scoring table of docs/fleet.md (the step,
rollout tokens/s per chip, and which stage bounds the step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlax_core.fleet.simulate import FleetParams, simulate  # noqa: E402

WORKERS = (1, 8, 64, 1024)
STALENESS = (0, 1, 2)


def measure_weight_sync(repeats: int = 3) -> float:
    """Seconds from publishing the quickstart model's weights to a fresh reader holding them (median)."""
    from rlax_core.models import from_pretrained
    from rlax_core.weights import WeightStore, WeightStoreConfig

    params = from_pretrained(str(REPO / "pipelines" / "assets" / "stories260K")).params
    times = []
    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as root:
        config = WeightStoreConfig(root=root, run_id="sim")
        for version in range(repeats):
            started = time.perf_counter()
            with WeightStore(config) as writer:
                writer.publish(version, params)
            with WeightStore(config) as reader:
                reader.load(version)
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def calibrate(scaling: dict) -> dict:
    one, two = scaling["one_worker"], scaling["two_workers"]
    tokens = one["per_worker"][0]["tokens_per_group"]
    seconds_per_token = 1.0 / (one["groups_per_s"] * tokens)
    steps = scaling["steps"]
    predicted = {}
    for workers in (1, 2):
        # the benchmark's setting: every step allowed at version 0 (k = steps), no trainer in the way
        params = FleetParams(workers=workers, max_staleness=steps, groups_per_step=scaling["groups_per_step"],
                             seconds_per_token=seconds_per_token, tokens_per_group=tokens, trainer_step_s=0.0,
                             weight_sync_s=0.0, groups_per_unit=scaling["groups_per_unit"],
                             groups_per_call=scaling["groups_per_call"], steps=steps,
                             warmup_steps=0)
        predicted[workers] = simulate(params).groups_per_s
    return {
        "seconds_per_token": seconds_per_token, "tokens_per_group": tokens,
        "measured_groups_per_s": {"1": one["groups_per_s"], "2": two["groups_per_s"]},
        "predicted_groups_per_s": {str(w): round(v, 3) for w, v in predicted.items()},
        "relative_error": {"1": round(predicted[1] / one["groups_per_s"] - 1, 4),
                           "2": round(predicted[2] / two["groups_per_s"] - 1, 4)},
        "scaling_load_average": scaling.get("load_average_after"),
    }


def table(seconds_per_token: float, tokens_per_group: float, trainer_step_s: float, weight_sync_s: float,
          groups_per_step: int, groups_per_call: int, steps: int) -> list[dict]:
    rows = []
    for k in STALENESS:
        for workers in WORKERS:
            params = FleetParams(workers=workers, max_staleness=k, groups_per_step=groups_per_step,
                                 seconds_per_token=seconds_per_token, tokens_per_group=tokens_per_group,
                                 trainer_step_s=trainer_step_s, weight_sync_s=weight_sync_s,
                                 groups_per_call=groups_per_call, steps=steps, warmup_steps=steps // 5)
            result = simulate(params)
            total = sum(result.staleness.values())
            rows.append({"workers": workers, "k": k, "groups_per_s": round(result.groups_per_s, 3),
                         "seconds_per_step": round(result.seconds_per_step, 3),
                         "trainer_idle_fraction": round(result.trainer_idle_fraction, 3),
                         "worker_busy_fraction": round(result.worker_busy_fraction, 4),
                         "staleness": {str(lag): round(n / total, 3) for lag, n in result.staleness.items()}})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| k | workers | groups/s | s per step | trainer idle | workers busy | staleness 0 / 1 / 2 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lags = " / ".join(f"{r['staleness'].get(str(lag), 0.0):.2f}" for lag in STALENESS)
        lines.append(f"| {r['k']} | {r['workers']:,} | {r['groups_per_s']:.2f} | {r['seconds_per_step']:.2f} | "
                     f"{r['trainer_idle_fraction']:.2f} | {r['worker_busy_fraction']:.3f} | {lags} |")
    return "\n".join(lines)


def compiled_markdown(result: dict) -> str:
    lines = ["| setting | k | sequences decoding | s per step | rollout tokens/s | trainer idle | workers busy | "
             "staleness 0 / 1 / 2 |", "|---|---|---|---|---|---|---|---|"]
    for name in ("prediction", "baseline_k0", "reserve"):
        r = result[name]
        lags = " / ".join(f"{r['staleness'].get(str(lag), 0.0):.2f}" for lag in STALENESS)
        lines.append(f"| {name} | {r['inputs']['max_staleness']['value']} | "
                     f"{r['inputs']['concurrent_sequences']['value']} | {r['seconds_per_step']:,.3g} | "
                     f"{r['rollout_tokens_per_s']:,.0f} | {r['trainer_idle_fraction']:.2f} | "
                     f"{r['worker_busy_fraction']:.2f} | {lags} |")
    return "\n".join(lines)


def fleet_rows(report_sets: list[str], trainer_step_s: float | None) -> list[dict]:
    """One prediction per comma-separated set of reports (a rollout's and a trainer's of one configuration)."""
    from pipelines.config import load_run_config
    from pipelines.fleet import predict_from_reports

    rows = []
    for reports in report_sets:
        paths = [path for path in reports.split(",") if path]
        result = predict_from_reports(paths, trainer_step_s=trainer_step_s)
        config = load_run_config(result["config"], result["overrides"])
        engine, rollout = config.engine, config.hardware.rollout
        rows.append({"config": result["config"], "reports": paths, "scoring": scoring_stage(config),
                     "samples_per_prompt": config.loop.sampling.samples_per_prompt,
                     "scoring_chips": config.hardware.workers_of("reward_model").chips if scoring_stage(config) else 0,
                     "engine": f"{rollout.hosts} x {rollout.chip} {rollout.chips_per_host} chips: {engine.weight_dtype} "
                               f"weights, {engine.cache_dtype} KV, {engine.num_pages:,} pages",
                     "prediction": result["prediction"], "baseline_k0": result["baseline_k0"]})
    return rows


def scoring_stage(config) -> str | None:
    """The reward model's own scoring stage in words, or None when scoring overlaps generation."""
    from pipelines.fleet import scoring_servers

    servers = scoring_servers(config)
    if not servers:
        return None
    settings, chips = config.loop.rewards.reward_model, config.hardware.workers_of("reward_model")
    return (f"{servers} x {chips.chip} host of {chips.chips_per_host} chip(s), one scoring: {Path(settings.path).name} "
            f"{settings.dtype}, rows of {settings.batch_size} x {settings.max_length}")


def scoring_markdown(rows: list[dict]) -> str:
    lines = ["| recipe | scoring stage | reward model per sequence | s per step, k | rollout tokens/s | per rollout chip | "
             "per chip, scoring's too | bound by | busy: rollout, scoring, trainer | k = 0: s per step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        r, b = row["prediction"], row["baseline_k0"]
        per_group = r["inputs"]["scoring_s_per_group"]["value"]
        per_sequence = f"{per_group / row['samples_per_prompt'] * 1e3:.3g} ms" if row["scoring"] else "-"
        scoring_busy = f"{r['scoring_busy_fraction']:.2f}" if row["scoring"] else "-"
        rollout_chips = r["rollout_tokens_per_s"] / r["rollout_tokens_per_s_per_chip"]
        lines.append(f"| {Path(row['config']).name} | {row['scoring'] or 'none (scoring overlaps generation)'} | "
                     f"{per_sequence} | {r['seconds_per_step']:,.4g}, {r['inputs']['max_staleness']['value']} | "
                     f"{r['rollout_tokens_per_s']:,.0f} | {r['rollout_tokens_per_s_per_chip']:,.0f} | "
                     f"{r['rollout_tokens_per_s'] / (rollout_chips + row['scoring_chips']):,.0f} | "
                     f"**{r['bound_by']}** | {r['worker_busy_fraction']:.2f}, {scoring_busy}, "
                     f"{1 - r['trainer_idle_fraction']:.2f} | {b['seconds_per_step']:,.4g} |")
    return "\n".join(lines)


def rows_markdown(rows: list[dict]) -> str:
    lines = ["| recipe | rollout workers and engine | sequences per worker | decode step | s per step, k | rollout tokens/s | "
             "per chip | engine tokens/s per chip | trainer idle | k = 0: s per step, tokens/s, idle |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        r, b = row["prediction"], row["baseline_k0"]
        inputs = r["inputs"]
        lines.append(f"| {Path(row['config']).name} | {row['engine']} | "
                     f"{inputs['concurrent_sequences']['value']} | {inputs['decode_step_s']['value'] * 1e3:.3g} ms | "
                     f"{r['seconds_per_step']:,.4g}, {inputs['max_staleness']['value']} | "
                     f"{r['rollout_tokens_per_s']:,.0f} | {r['rollout_tokens_per_s_per_chip']:,.0f} | "
                     f"{r['engine_tokens_per_s_per_chip']:,.0f} | {r['trainer_idle_fraction']:.2f} | "
                     f"{b['seconds_per_step']:,.4g} s, {b['rollout_tokens_per_s']:,.0f}, {b['trainer_idle_fraction']:.2f} |")
    return "\n".join(lines)


def main_rows(args: argparse.Namespace) -> None:
    try:
        rows = fleet_rows(args.rows, args.trainer_step_s)
    except ValueError as error:
        raise SystemExit(f"fleet_sim: {error}")
    print(json.dumps({"benchmark": "fleet_sim_rows", "rows": rows,
                      "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2))
    if args.markdown:
        print(scoring_markdown(rows) if any(row["scoring"] for row in rows) else rows_markdown(rows))


def main_compiled(args: argparse.Namespace) -> None:
    from pipelines.fleet import predict_from_reports

    try:
        result = predict_from_reports(args.compiled, args.prompt_tokens, args.completion_fraction,
                                      args.host_network_gbps * 1e9 / 8, args.trainer_step_s)
    except ValueError as error:
        raise SystemExit(f"fleet_sim: {error}")
    print(json.dumps({"benchmark": "fleet_sim_compiled", **result,
                      "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2))
    if args.markdown:
        print(compiled_markdown(result))


def main() -> None:
    from rlax_core.fleet.compiled import HOST_NETWORK_BYTES_PER_S

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compiled", nargs="+", metavar="REPORT",
                        help="predict from `rlax compile --json` reports instead (the first names the recipe; "
                             "a role's programs come from the first report that has them)")
    parser.add_argument("--rows", nargs="+", metavar="REPORT,REPORT",
                        help="one table row per comma-separated set of reports (a configuration's rollout and "
                             "trainer reports), predicted as --compiled predicts one")
    parser.add_argument("--prompt-tokens", type=int, help="with --compiled: mean prompt length (assumed; "
                        "default: the smallest prefill bucket)")
    parser.add_argument("--completion-fraction", type=float, default=0.5,
                        help="with --compiled: mean completion length as a fraction of max_new_tokens (assumed)")
    parser.add_argument("--trainer-step-s", type=float,
                        help="with --compiled: the trainer's seconds per step instead of the compiled "
                             "update's (assumed)")
    parser.add_argument("--host-network-gbps", type=float, default=HOST_NETWORK_BYTES_PER_S * 8 / 1e9,
                        help="with --compiled: a TPU VM's network bandwidth (default: v5e's published 2 x 100 Gbps)")
    parser.add_argument("--scaling", help="benchmarks/rollout_scaling.py's JSON output (default: run it now)")
    parser.add_argument("--trainer-s-per-group", type=float, default=0.15 / 8,
                        help="trainer seconds per group of a step (default: 0.15 s / 8 groups, docs/training.md)")
    parser.add_argument("--weight-sync-s", type=float, help="skip measuring the weight sync and use this")
    parser.add_argument("--groups-per-step", type=int, default=512)
    parser.add_argument("--steps", type=int, default=40, help="steps simulated per configuration (a fifth warm up)")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = parser.parse_args()
    if args.rows:
        return main_rows(args)
    if args.compiled:
        return main_compiled(args)
    if args.scaling:
        try:
            scaling = json.loads(Path(args.scaling).read_text())
        except (OSError, ValueError) as error:
            raise SystemExit(f"fleet_sim: cannot read the rollout_scaling JSON {args.scaling}: {error}")
    else:
        print("fleet_sim: measuring with benchmarks/rollout_scaling.py first", file=sys.stderr)
        done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rollout_scaling.py")], check=True,
                              stdout=subprocess.PIPE, text=True)
        scaling = json.loads(done.stdout)
    calibration = calibrate(scaling)
    sync_s = args.weight_sync_s if args.weight_sync_s is not None else measure_weight_sync()
    trainer_step_s = args.trainer_s_per_group * args.groups_per_step
    rows = table(calibration["seconds_per_token"], calibration["tokens_per_group"], trainer_step_s, sync_s,
                 args.groups_per_step, scaling["groups_per_call"], args.steps)
    print(json.dumps({
        "benchmark": "fleet_sim", "calibration": calibration,
        "inputs": {"seconds_per_token": calibration["seconds_per_token"],
                   "tokens_per_group": calibration["tokens_per_group"], "trainer_step_s": trainer_step_s,
                   "weight_sync_s": round(sync_s, 4), "weight_sync_measured": args.weight_sync_s is None,
                   "groups_per_step": args.groups_per_step, "groups_per_unit": 1,
                   "groups_per_call": scaling["groups_per_call"]},
        "table": rows, "load_average": [round(x, 2) for x in os.getloadavg()],
    }, indent=2))
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
