"""Rollout throughput with 1 and with 2 workers: does the fleet scale with its workers?

A worker here is what a Dataflow worker is there: an SDK worker process with its own engine, pinned
to one core. Prism with its loopback environment runs one SDK process, so this benchmark runs the
rollout DoFns on Beam's portable FnApiRunner with ``direct_num_workers=W``, which starts W SDK
worker processes and deals each stage's input over them; each process is started through this file
(``--sdk-worker``), which pins it to a core of its own (``os.sched_setaffinity``, before JAX starts,
so XLA sizes its thread pool to that one core) and then runs Beam's ``sdk_worker_main``.

The pipeline is the rollout fleet's: ``ScheduleSteps`` (every step allowed at once: version 0 and
k = steps) -> ``Reshuffle`` -> ``GenerateRollouts`` -> ``ScoreRollouts`` -> ``WriteGroups`` on the
quickstart's model, engine and task (``configs/quickstart.yaml``), with a tap after the write that
records which worker wrote which group when. Both runs generate the same groups.

A first stage builds and compiles every worker's engine (``GenerateRollouts``' own setup, through
the same ``Shared`` handle); the tick that schedules the steps comes out of it, so all workers start
generating together. Throughput still leaves out each worker's first engine call: a worker's rate is
(its groups after its first call) / (its last write - the end of its first call), and the fleet's is
the sum of its workers' rates (``overlap``: the fraction of the shortest worker span that both were
writing, near 1 when they ran side by side). The wall time of each run, start-up included, is
printed beside it.

    python benchmarks/rollout_scaling.py                          # 1 and 2 workers, 96 groups each
    python benchmarks/rollout_scaling.py --steps 4 --groups-per-step 8   # short settings

Prints one JSON object: groups/s for each, the ratio (target >= 1.6; with ``--rounds N`` the median
round's, the 1- and 2-worker runs alternating in order), per-worker figures, the load average before
and after, the method, and what ``benchmarks/fleet_sim.py`` calibrates on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PIN_DIR_ENV = "RLAX_BENCH_PIN_DIR"  # where worker processes claim their cores
PIN_CORES_ENV = "RLAX_BENCH_PIN_CORES"  # the cores to deal out, comma-separated


def sdk_worker() -> None:
    """An SDK worker process pinned to the first core no other worker of this run has claimed."""
    pin_dir, cores = os.environ[PIN_DIR_ENV], [int(c) for c in os.environ[PIN_CORES_ENV].split(",")]
    for core in cores:
        try:
            os.close(os.open(os.path.join(pin_dir, f"core_{core}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        os.sched_setaffinity(0, {core})
        break
    else:
        raise SystemExit(f"rollout_scaling: more SDK workers than cores {cores}")
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv[:1])


def _spec(root: Path, steps: int, groups_per_step: int, groups_per_unit: int, max_new_tokens: int):
    import dataclasses

    from pipelines.config import load_run_config
    from pipelines.rl_stream import build_spec
    from rlax_core.tasks.story import story_examples, write_jsonl

    train_set = root / "train.jsonl"
    write_jsonl(story_examples("train", steps * groups_per_step), train_set)
    overrides = [f"run.output_dir={root}", f"trainer.groups_per_step={groups_per_step}",
                 f"trainer.total_steps={steps}", f"trainer.max_staleness={steps}", "engine.replicas=1",
                 f"engine.max_new_tokens={max_new_tokens}", f"loop.groups_per_unit={groups_per_unit}",
                 f"loop.train_set={train_set}"]
    run_config = load_run_config(str(REPO / "configs" / "quickstart.yaml"), overrides)
    return dataclasses.replace(build_spec(run_config, steps * groups_per_step), run="scaling")


class _Tap:
    """After WriteGroups (same worker process): which worker wrote which group, and when."""

    def __init__(self, path: str):
        self._path = path

    def __call__(self, written):
        step, summary = written
        with open(self._path, "a") as sink:
            sink.write(json.dumps({"worker": summary["worker"], "step": step, "slot": summary["slot"],
                                   "time": time.time(), "tokens": sum(summary["lengths"]),
                                   "generate_seconds": summary["generate_seconds"]}) + "\n")


def _warm_up_dofn():
    # Built on first use: this file is also each SDK worker's entry point, which must pin its core
    # before anything imports JAX (XLA sizes its thread pool to the cores it may use).
    from transforms.rollout import GenerateRollouts

    class WarmUp(GenerateRollouts):
        """GenerateRollouts' own setup (the worker's shared engine, compiled), and nothing else."""

        def process(self, element):
            yield self._worker.name

    return WarmUp


def _WarmUp(spec, shared):
    return _warm_up_dofn()(spec, shared)


def run_fleet(workers: int, cores: list[int], spec, work: Path) -> dict:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment
    from apache_beam.utils.shared import Shared

    from rlax_core.data.rollout_store import RolloutStore
    from transforms.rollout import GenerateRollouts, ScheduleSteps, ScoreRollouts, WriteGroups

    pin_dir = work / f"pins-{workers}"
    pin_dir.mkdir()
    os.environ[PIN_DIR_ENV], os.environ[PIN_CORES_ENV] = str(pin_dir), ",".join(map(str, cores[:workers]))
    tap = work / f"writes-{workers}.jsonl"
    command = f"{sys.executable} {Path(__file__).resolve()} --sdk-worker"
    runner = FnApiRunner(default_environment=SubprocessSDKEnvironment.from_command_string(command))
    # direct_running_mode stays in_memory so that the runner keeps the pinned environment above; the
    # number of SDK worker processes and the dealing of each stage's input follow direct_num_workers.
    options = PipelineOptions(direct_num_workers=workers)
    shared = Shared()  # one handle for both stages: the warm-up's engine is the one that generates
    started = time.time()
    with beam.Pipeline(runner=runner, options=options) as p:
        version = beam.pvalue.AsList(p | "Version" >> beam.Create([0]))
        # Stage 1 builds and compiles every worker's engine; the tick that schedules the steps comes
        # out of it, so generation starts once all workers are ready and runs on all of them at once.
        tick = (p | "Workers" >> beam.Create(range(workers)) | "OnePerWorker" >> beam.Reshuffle()
                | "WarmUp" >> beam.ParDo(_WarmUp(spec, shared)) | "AllReady" >> beam.combiners.Count.Globally()
                | "Tick" >> beam.Map(lambda _: None))  # a tick without a version: the side input names it
        _ = (tick
             | "ScheduleSteps" >> beam.ParDo(ScheduleSteps(spec), version)
             | "Redistribute" >> beam.Reshuffle()
             | "GenerateRollouts" >> beam.ParDo(GenerateRollouts(spec, shared), version)
             | "ScoreRollouts" >> beam.ParDo(ScoreRollouts(spec))
             | "WriteGroups" >> beam.ParDo(WriteGroups(spec))
             | "Tap" >> beam.Map(_Tap(str(tap))))
    wall = time.time() - started
    records = [json.loads(line) for line in tap.read_text().splitlines()]
    expected = spec.total_steps * spec.prompts_per_step
    written = RolloutStore(spec.rollout_root, spec.run).list_groups()
    if len(written) != expected or len({(r["step"], r["slot"]) for r in records}) != expected:
        raise SystemExit(f"rollout_scaling: {workers} workers wrote {len(written)} groups, expected {expected}")
    return {"workers": workers, "wall_s": round(wall, 2), **_rates(records, workers)}


def _rates(records: list[dict], workers: int) -> dict:
    by_worker: dict[str, list[dict]] = {}
    for record in records:
        by_worker.setdefault(record["worker"], []).append(record)
    if len(by_worker) != workers:
        raise SystemExit(f"rollout_scaling: asked for {workers} workers, groups came from {len(by_worker)}")
    per_worker, spans = [], []
    for name, rows in sorted(by_worker.items()):
        rows.sort(key=lambda r: r["time"])
        # The groups of one engine call carry the same share of its seconds: the first call's are
        # those that share the first-written group's.
        first_call = [r for r in rows if r["generate_seconds"] == rows[0]["generate_seconds"]]
        first_end = max(r["time"] for r in first_call)
        steady_groups = sum(r["time"] > first_end for r in rows)
        times = [r["time"] for r in rows]
        span = times[-1] - first_end
        spans.append((first_end, times[-1]))
        tokens = sum(r["tokens"] for r in rows)
        per_worker.append({
            "worker": name, "groups": len(rows), "steady_groups": steady_groups, "steady_span_s": round(span, 2),
            "groups_per_s": round(steady_groups / span, 3) if span > 0 else None,
            "tokens_per_group": round(tokens / len(rows), 1),
            "engine_seconds_per_group": round(sum(r["generate_seconds"] for r in rows) / len(rows), 4)})
    if any(w["groups_per_s"] is None for w in per_worker):
        raise SystemExit("rollout_scaling: a worker wrote all its groups in one engine call; use more --steps")
    overlap_start, overlap_end = max(s for s, _ in spans), min(e for _, e in spans)
    shortest = min(e - s for s, e in spans)
    return {"groups_per_s": round(sum(w["groups_per_s"] for w in per_worker), 3),
            "overlap": round(max(0.0, overlap_end - overlap_start) / shortest, 3) if shortest > 0 else 0.0,
            "per_worker": per_worker}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sdk-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=12, help="schedule steps generated by each run")
    parser.add_argument("--groups-per-step", type=int, default=8, help="prompt groups per step (G = 8 samples each)")
    parser.add_argument("--groups-per-unit", type=int, default=1, help="groups per work unit (loop.groups_per_unit)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--cores", default="0,1", help="cores to pin the workers to, one each")
    parser.add_argument("--rounds", type=int, default=1, help="1- and 2-worker runs, alternating; the median ratio")
    args = parser.parse_args()
    if args.sdk_worker:
        return sdk_worker()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    cores = [int(c) for c in args.cores.split(",")]
    if args.rounds < 1 or args.steps < 1 or args.groups_per_step < 1:
        raise SystemExit("rollout_scaling: --rounds, --steps and --groups-per-step must be >= 1")
    if len(cores) < 2:
        raise SystemExit("rollout_scaling: --cores needs two cores (one per worker of the 2-worker run)")
    load_before = [round(x, 2) for x in os.getloadavg()]
    rounds = []  # (1-worker run, 2-worker run); the order alternates so that a drifting machine hits both
    with tempfile.TemporaryDirectory(prefix="rollout-scaling-") as tmp:
        for index in range(args.rounds):
            runs = {}
            for workers in ((1, 2) if index % 2 == 0 else (2, 1)):
                work = Path(tmp) / f"r{index}-w{workers}"
                work.mkdir()
                spec = _spec(work, args.steps, args.groups_per_step, args.groups_per_unit, args.max_new_tokens)
                _publish_base_weights(spec)
                runs[workers] = run_fleet(workers, cores, spec, work)
                print(f"rollout_scaling: round {index + 1}/{args.rounds}, {workers} worker(s): "
                      f"{runs[workers]['groups_per_s']} groups/s", file=sys.stderr)
            rounds.append((runs[1], runs[2]))
    ratios = sorted(two["groups_per_s"] / one["groups_per_s"] for one, two in rounds)
    ratio = ratios[len(ratios) // 2]
    one, two = next((o, t) for o, t in rounds if t["groups_per_s"] / o["groups_per_s"] == ratio)  # the median round
    print(json.dumps({
        "benchmark": "rollout_scaling",
        "method": ("FnApiRunner (portable, batch) with direct_num_workers=W: W SDK worker processes started "
                   "through --sdk-worker, each pinned to one core with os.sched_setaffinity before JAX starts, "
                   "each with its own engine (engine.replicas=1); the rollout DoFns of transforms/rollout.py"),
        "throughput": "sum over workers of groups/s after each worker's first (compiling) engine call",
        "model": "stories260K (configs/quickstart.yaml engine)", "samples_per_prompt": spec.loop.sampling.samples_per_prompt,
        "max_new_tokens": args.max_new_tokens, "steps": args.steps, "groups_per_step": args.groups_per_step,
        "groups_per_run": args.steps * args.groups_per_step, "groups_per_unit": args.groups_per_unit,
        "groups_per_call": spec.engine.num_slots // spec.loop.sampling.samples_per_prompt,  # GenerateRollouts fills the engine's slots
        "cores": cores[:2], "cpu_count": os.cpu_count(),
        "one_worker": one, "two_workers": two,
        "groups_per_s_1": one["groups_per_s"], "groups_per_s_2": two["groups_per_s"],
        "ratio": round(ratio, 3), "round_ratios": [round(r, 3) for r in ratios], "target_ratio": 1.6,
        "meets_target": ratio >= 1.6,
        "load_average_before": load_before, "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }, indent=2))


def _publish_base_weights(spec) -> None:
    from rlax_core.models import from_pretrained
    from rlax_core.weights.store import WeightStore

    with WeightStore(spec.weights) as store:
        store.publish(0, from_pretrained(spec.model_path).params)


if __name__ == "__main__":
    main()
