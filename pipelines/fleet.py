"""A recipe's fleet predicted from its compiled programs: ``rlax compile --json`` reports in, the
simulator's figures out (``rlax_core.fleet.compiled``).

    python benchmarks/fleet_sim.py --compiled runs/compile-qwq32b.json

The recipe is the one the first report names (its ``config`` and ``overrides``), so a report
compiled with overrides (another chip for the rollout fleet) predicts that fleet. Programs come from
the reports in order: a role's programs are taken from the first report that compiled them, so a
rollout-only report can be paired with the recipe's full one for the trainer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

from rlax_core.fleet.compiled import HOST_NETWORK_BYTES_PER_S, FleetShape, read_compiled_costs
from rlax_core.utils.dtypes import itemsize


def read_reports(paths: Sequence[str | Path]) -> dict[str, Any]:
    """One report from several: the first's recipe, each role's programs from the first report that has them."""
    if not paths:
        raise ValueError("no compile report given")
    reports = []
    for path in paths:
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read the compile report {path}: {error}") from error
    merged, roles = dict(reports[0], programs=[]), set()
    for report in reports:
        mine = {p["role"] for p in report.get("programs", [])} - roles
        merged["programs"] += [p for p in report.get("programs", []) if p["role"] in mine]
        roles |= mine
    return merged


def fleet_shape(config, prompt_tokens: int | None = None, completion_fraction: float = 0.5,
                host_network_bytes_per_s: float = HOST_NETWORK_BYTES_PER_S) -> FleetShape:
    """The simulator's view of a ``RunConfig``; a prompt is assumed to fill the smallest prefill bucket
    unless ``prompt_tokens`` says otherwise, a completion to be ``completion_fraction`` of the budget."""
    from pipelines.config import policy_shape
    from rlax_core.config import ConfigError

    hardware = config.hardware
    if hardware is None or hardware.rollout is None or hardware.trainer is None:
        raise ConfigError("hardware", "the recipe names no rollout and trainer slices to simulate")
    if not 0 < completion_fraction <= 1:
        raise ConfigError("completion_fraction", f"must lie in (0, 1], not {completion_fraction}")
    engine, trainer = config.engine, config.trainer
    from rlax_core.planning.memory import mean_occupancy

    model = policy_shape(config)
    layers = 1.0
    if trainer.scan_layers:  # XLA counts the scanned block once
        one_layer = dataclasses.replace(model, num_layers=1)
        layers = model.flops_per_token(trainer.max_seq_len) / one_layer.flops_per_token(trainer.max_seq_len)
    budget = config.loop.sampling.budget(engine)
    # The recipe's response lengths where it states them, else completions of completion_fraction of
    # the budget (all of them that long: a running one holds half of it on average).
    stated = config.loop.response_lengths
    lengths = stated.sample(budget) if (stated.mean or stated.measured) else []
    mean_length = sum(lengths) / len(lengths) if lengths else 0
    dtype = (config.weights.publish_dtype if config.weights is not None else None) or config.trainer.param_dtype
    return FleetShape(
        rollout_workers=hardware.rollout.hosts, trainer_hosts=hardware.trainer.hosts,
        groups_per_step=config.trainer.groups_per_step, samples_per_prompt=config.loop.sampling.samples_per_prompt,
        max_staleness=trainer.max_staleness,
        update_iterations=trainer.ppo_epochs * trainer.mini_batches * trainer.micro_batches,
        num_slots=engine.num_slots, num_pages=engine.num_pages, page_size=engine.page_size,
        max_new_tokens=config.loop.sampling.budget(engine),
        prompt_tokens=prompt_tokens or min(engine.prefill_buckets),
        completion_tokens=max(1, round(mean_length if lengths else completion_fraction * budget)),
        weight_bytes=model.num_params * itemsize(dtype), layer_loop_factor=layers,
        host_network_bytes_per_s=host_network_bytes_per_s, admission=engine.admission,
        occupancy_tokens=mean_occupancy(lengths) if lengths else completion_fraction * budget / 2,
        groups_per_unit=config.loop.groups_per_unit, chips_per_worker=hardware.rollout.chips_per_host,
        scoring_servers=scoring_servers(config))


def scoring_servers(config) -> int:
    """The scoring stage's servers: a ``reward_model`` term placed on its own stage runs one model per
    worker process, whole on one chip (``rewards.reward_model``), so one per host of
    ``hardware.reward_model`` (by default the rollout fleet's kind); 0 when scoring overlaps generation."""
    rewards = config.loop.rewards
    if rewards is None or "reward_model" not in rewards.terms or rewards.reward_model.placement != "own_stage":
        return 0
    return config.hardware.workers_of("reward_model").hosts


def kv_reads_of(config, report: dict[str, Any]) -> dict[str, Any]:
    """The rollout decode's KV bytes per page on one chip by the recipe's engine (for a report compiled
    before ``rlax compile`` counted them; ``compile.decode_step``)."""
    from pipelines.config import policy_shape
    from rlax_core.planning.memory import decode_kv_read_bytes

    decodes = [p["program"] for p in report.get("programs", []) if p["role"] == "rollout"
               and p["program"].startswith("decode")]
    kernel = "tpu" if decodes and decodes[0].endswith("(tpu)") else ""
    engine = config.engine
    return {"kv_bytes_per_page": decode_kv_read_bytes(policy_shape(config), engine, [engine.page_size], kernel),
            "page_size": engine.page_size}


def predict_from_reports(paths: Sequence[str | Path], prompt_tokens: int | None = None,
                         completion_fraction: float = 0.5,
                         host_network_bytes_per_s: float = HOST_NETWORK_BYTES_PER_S,
                         trainer_step_s: float | None = None) -> dict[str, Any]:
    """The prediction for the recipe the first report names, its k = 0 twin as the baseline beside it
    and its twin reserving whole budgets (``engine.admission: reserve``, the engine before pages on
    demand); a given ``trainer_step_s`` replaces the compiled update's."""
    from pipelines.config import load_run_config
    from rlax_core.fleet.compiled import predict

    report = read_reports(paths)
    config = load_run_config(report["config"], report.get("overrides") or [])
    shape = fleet_shape(config, prompt_tokens, completion_fraction, host_network_bytes_per_s)
    costs = read_compiled_costs(report, need_update=trainer_step_s is None, **kv_reads_of(config, report))
    return {"config": report["config"], "overrides": report.get("overrides") or [],
            "reports": [str(p) for p in paths],
            "prediction": predict(costs, shape, trainer_step_s=trainer_step_s),
            "baseline_k0": predict(costs, dataclasses.replace(shape, max_staleness=0), trainer_step_s=trainer_step_s),
            "reserve": predict(costs, dataclasses.replace(shape, admission="reserve"), trainer_step_s=trainer_step_s)}


def best_split(paths: Sequence[str | Path], chips: int, trainer_step_s: float | None = None,
               splits: int = 16, steps: int = 24) -> dict[str, Any]:
    """The split of ``chips`` between rollout hosts and the trainer that trains the most tokens per
    second for the recipe the first report names, from the same compiled costs as
    ``predict_from_reports``: for trainer slices of 1/``splits`` .. (``splits`` - 1)/``splits`` of
    the chips (whole hosts of either kind) and the recipe's own trainer, the fleet is simulated with
    the rest as rollout hosts. A trainer of ``T`` chips is taken to run its step in the compiled
    (or given) step's time x the recipe's trainer chips / ``T``: data parallel at constant
    efficiency, an assumption the result names. Tokens trained per second are the simulated groups
    per second x tokens per group (every group generated is trained, within k)."""
    from pipelines.config import load_run_config
    from rlax_core.config import ConfigError
    from rlax_core.fleet.compiled import compiled_trainer_step_s, predict

    report = read_reports(paths)
    config = load_run_config(report["config"], report.get("overrides") or [])
    shape = fleet_shape(config)
    costs = read_compiled_costs(report, need_update=trainer_step_s is None, **kv_reads_of(config, report))
    rollout_host, trainer_host = config.hardware.rollout.chips_per_host, config.hardware.trainer.chips_per_host
    recipe_trainer = config.hardware.trainer.chips
    if chips < rollout_host + trainer_host:
        raise ConfigError("chips", f"{chips} chips hold no rollout host ({rollout_host} chips) beside a trainer host "
                          f"({trainer_host})")
    base_step = trainer_step_s if trainer_step_s is not None else compiled_trainer_step_s(costs, shape)
    candidates = {max(trainer_host, chips * i // splits // trainer_host * trainer_host) for i in range(1, splits)}
    if recipe_trainer < chips:
        candidates.add(recipe_trainer)
    rows = []
    for trainer_chips in sorted(candidates):
        workers = (chips - trainer_chips) // rollout_host
        if workers < 1:
            continue
        step_s = base_step * recipe_trainer / trainer_chips
        split = dataclasses.replace(shape, rollout_workers=workers, trainer_hosts=trainer_chips // trainer_host)
        result = predict(costs, split, steps=steps, trainer_step_s=step_s)
        rows.append({"trainer_chips": trainer_chips, "rollout_chips": workers * rollout_host, "rollout_workers": workers,
                     "trainer_step_s": step_s, "seconds_per_step": result["seconds_per_step"],
                     "tokens_trained_per_s": result["rollout_tokens_per_s"],
                     "trainer_idle_fraction": result["trainer_idle_fraction"],
                     "worker_busy_fraction": result["worker_busy_fraction"]})
    best = max(rows, key=lambda row: row["tokens_trained_per_s"])
    return {"config": report["config"], "chips": chips, "reports": [str(p) for p in paths],
            "trainer_step_s": {"value": base_step, "at_chips": recipe_trainer,
                               "from": "given" if trainer_step_s is not None else "compiled",
                               "scaling": "assumed: data parallel at constant efficiency"},
            "splits": rows, "best": best}


def split_table(sweep: dict[str, Any]) -> str:
    lines = ["| trainer chips | rollout chips (workers) | trainer step | s per step | tokens trained/s | trainer idle | "
             "workers busy |", "|---|---|---|---|---|---|---|"]
    for row in sweep["splits"]:
        mark = "**" if row is sweep["best"] else ""
        lines.append(f"| {mark}{row['trainer_chips']:,}{mark} | {row['rollout_chips']:,} ({row['rollout_workers']}) | "
                     f"{row['trainer_step_s']:,.3g} s | {row['seconds_per_step']:,.3g} | "
                     f"{mark}{row['tokens_trained_per_s']:,.0f}{mark} | {row['trainer_idle_fraction']:.2f} | "
                     f"{row['worker_busy_fraction']:.2f} |")
    return "\n".join(lines)
