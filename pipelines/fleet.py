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
        occupancy_tokens=mean_occupancy(lengths) if lengths else completion_fraction * budget / 2)


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
    costs = read_compiled_costs(report, need_update=trainer_step_s is None)
    return {"config": report["config"], "overrides": report.get("overrides") or [],
            "reports": [str(p) for p in paths],
            "prediction": predict(costs, shape, trainer_step_s=trainer_step_s),
            "baseline_k0": predict(costs, dataclasses.replace(shape, max_staleness=0), trainer_step_s=trainer_step_s),
            "reserve": predict(costs, dataclasses.replace(shape, admission="reserve"), trainer_step_s=trainer_step_s)}
