"""``rlax compile``: every program of a recipe's roles compiled ahead of time for the chips it names.

    rlax compile --config configs/qwen25_7b_math_dataflow_tpu.yaml --json runs/compile-7b.json

Runs in the lock-tpu environment for TPU slices (``make setup-tpu-compile`` builds ``.venv-tpu``: libtpu
is the TPU compiler) and in the lock-gpu environment for NVIDIA GPUs (``make setup-gpu-compile`` builds
``.venv-gpu``: jax's CUDA plugin, ptxas and cuDNN); no TPU or GPU is needed.
Per role of the recipe (``rlax plan``'s roles: rollout, filter and evaluate engines on the rollout
workers, the trainer on its slice, a ``reward_model`` term's forward on a rollout chip beside the engine
or on its own scoring stage's chip, and when named ``sft`` and ``dpo``, the post-training jobs' steps
on the trainer's slice: ``--roles sft,dpo``), the programs of ``rlax_core.compile.programs`` are compiled for
the slice from the recipe's ``hardware:`` section, and each prints: compiled or the compiler's error,
XLA's bytes per chip against the planner's figure and the chip's HBM, FLOPs, bytes accessed, XLA's
optimal time and the roofline time, and the attention kernels in the compiled program (Pallas kernels
lowered through Mosaic on TPU; cuDNN's fused attention and Pallas Triton kernels on GPU). ``--json`` writes
the same as JSON. Engines of identical configuration compile once (filter and evaluate usually share
the rollout engine's programs; an engine that samples differently shares its prefills).
``--roles`` and ``--programs`` (names or their beginnings: ``'prefill 4x512,decode,update step'``)
compile a subset: a full-size program takes minutes to a quarter of an hour on a small host, and a
role's XLA figure is then that of the programs compiled. Exit 1 when a program fails to compile or a
role exceeds its chip's HBM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

HELP = ("compile every program of the recipe's roles for the TPU slices or GPUs it names "
        "(lock-tpu or lock-gpu environment; no TPU or GPU needed)")

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--roles", default="rollout,trainer,filter,evaluate,reward_model",
                        help="comma-separated roles to compile (default: all the recipe has; sft and dpo, "
                             "the rlax sft and rlax dpo trainers' steps, when named)")
    parser.add_argument("--programs", default="",
                        help="comma-separated program names or their beginnings to compile, e.g. "
                             "'prefill 4x512,decode,update step' (default: every program of the roles)")
    parser.add_argument("--json", dest="json_path", help="also write the reports to this JSON file")


def role_programs(config, roles) -> list[tuple[str, object, object, list]]:
    """(role, slice spec, memory plan, programs) per role of a ``RunConfig`` with TPU hardware."""
    from pipelines.config import resolve_asset
    from pipelines.plan import template_of, memory_plans
    from pipelines.config import policy_shape
    from rlax_core.compile.programs import engine_programs, trainer_programs
    from rlax_core.compile.topology import slice_devices
    from rlax_core.config import ConfigError
    from rlax_core.inference.sequences import sampling_mode
    from rlax_core.models.checkpoint import read_model_config

    if config.hardware is None:
        raise ConfigError("hardware", "the recipe declares no hardware: section; there is no slice to compile for")
    plans = {plan.role: plan for plan in memory_plans(config, roles)}
    out = []
    # A LoRA run's rollout engine serves the policy's adapter versions on its base (``engine.lora_mode``).
    lora = config.trainer.lora if config.trainer.lora.enabled else None
    engines = [("rollout", config.model.path, config.engine, config.model.dtype,
                sampling_mode(config.loop.sampling.params(config.engine)), lora)]
    filter_ = config.filter.generation
    engines.append(("filter", filter_.model, filter_.engine, filter_.dtype, sampling_mode(filter_.params()), None))
    evaluate = config.evaluate.generation
    engines += [("evaluate", path, evaluate.engine, evaluate.dtype, sampling_mode(evaluate.params()), None)
                for path in config.evaluate.models]
    for role, path, engine, dtype, mode, lora in engines:
        slice_ = config.hardware.workers_of(role)
        if role not in plans or not path or slice_ is None:
            continue
        model = policy_shape(config) if role == "rollout" else read_model_config(template_of(resolve_asset(path)))
        out.append((role, slice_, plans[role], (model, engine, dtype, mode, slice_, lora),
                    lambda model=model, engine=engine, dtype=dtype, mode=mode, role=role, slice_=slice_, lora=lora:
                    engine_programs(model, engine, dtype, slice_devices(slice_.chip, slice_.chips_per_host,
                                                                        slice_.chips_per_host), mode, role, lora)))
    out.extend(scoring_model_roles(config, plans))
    if "trainer" in plans and config.hardware.trainer is not None:
        slice_ = config.hardware.trainer
        model = policy_shape(config)
        rows = config.rows_per_step()
        # Packed rows: a rollout assumed as the fleet simulator assumes it (pipelines.fleet.fleet_shape):
        # its prompt the smallest prefill bucket, its completion half the budget.
        engine = config.engine
        mean_tokens = min(engine.prefill_buckets) + round(0.5 * config.loop.sampling.budget(engine))
        out.append(("trainer", slice_, plans["trainer"], None,
                    lambda slice_=slice_: trainer_programs(model, config.algorithm, config.trainer,
                                             slice_devices(slice_.chip, slice_.chips, slice_.chips_per_host), rows,
                                             mean_tokens)))
    out += post_training_programs(config, plans)
    return out


def post_training_programs(config, plans) -> list[tuple[str, object, object, None, object]]:
    """``rlax sft``'s and ``rlax dpo``'s update step on the trainer's slice (roles ``sft``, ``dpo``:
    ``rlax plan --post-training``'s), for the batch each job steps on: ``sft.examples_per_step``
    samples, or both samples of ``dpo.pairs_per_step`` pairs and the reference (a frozen copy in the
    step, or its precomputed log-probs with the batch); rows packed from samples of half ``max_seq_len``."""
    from pipelines.config import policy_shape
    from rlax_core.compile.programs import trainer_programs
    from rlax_core.compile.topology import slice_devices
    from rlax_core.training.preference import PreferenceObjective
    from rlax_core.training.supervised import SupervisedObjective

    slice_ = config.hardware.trainer
    jobs = {"sft": (lambda: SupervisedObjective(config.sft.loss_aggregation), config.sft.examples_per_step, ()),
            "dpo": (lambda: PreferenceObjective(config.dpo), 2 * config.dpo.pairs_per_step,
                    ("reference_logprobs",) if config.dpo.reference == "precomputed" else ())}
    out = []
    for role, (objective, rows, per_sample) in jobs.items():
        if role in plans and slice_ is not None:
            out.append((role, slice_, plans[role], None, lambda objective=objective, rows=rows, per_sample=per_sample,
                        role=role: trainer_programs(policy_shape(config), objective(), config.trainer, slice_devices(
                            slice_.chip, slice_.chips, slice_.chips_per_host), rows, role=role, per_sample=per_sample)))
    return out


def scoring_model_roles(config, plans) -> list[tuple]:
    """The forwards of the scoring's models (a ``reward_model`` term's, a distillation teacher's): on
    one rollout chip beside the engine (their programs join the rollout role's), or on one chip of
    their own scoring stage (the reward_model role)."""
    from pipelines.config import scoring_models
    from rlax_core.compile.reward_model import reward_model_programs
    from rlax_core.compile.topology import slice_devices

    out = []
    for placement, role in (("rollout_worker", "rollout"), ("own_stage", "reward_model")):
        slice_ = config.hardware.workers_of(role)
        if role not in plans or slice_ is None:
            continue
        for _, model, settings in scoring_models(config, placement):
            out.append((role, slice_, plans[role], None, lambda model=model, settings=settings, role=role, slice_=slice_:
                        reward_model_programs(model, settings.batch_size, settings.max_length, settings.dtype,
                                              slice_devices(slice_.chip, slice_.chips_per_host, slice_.chips_per_host),
                                              role)))
    return out


def selected(name: str, programs: tuple[str, ...]) -> bool:
    """Whether ``--programs`` names the program ``name`` (by its whole name or a beginning of it)."""
    return not programs or any(name.startswith(wanted) for wanted in programs)


def compile_roles(config, roles, programs_wanted: tuple[str, ...] = ()) -> tuple[list, dict, dict]:
    """Compile each role's programs (those ``programs_wanted`` names; all when empty): (reports, HBM
    bytes per role, planned bytes per role)."""
    from pipelines.plan import POST_TRAINING_ROLES
    from rlax_core.compile.report import ProgramReport, compile_program
    from rlax_core.compile.topology import compiled_ahead, not_compiled_ahead, topology_name

    reports, hbm, planned, done = [], {}, {}, {}
    for role, slice_, plan, engine_key, programs in role_programs(config, roles):
        hbm[role], planned[role] = slice_.bytes_per_chip, plan.total
        if not compiled_ahead(slice_.chip):  # one line, and no failure: the role compiles where it runs
            reports.append(ProgramReport(role, "(every program)", slice_.chip, "-", compiled=False,
                                         error=f"not compiled: {not_compiled_ahead(slice_.chip)}"))
            continue
        chips = slice_.chips if role in ("trainer", *POST_TRAINING_ROLES) else slice_.chips_per_host
        topology = topology_name(slice_.chip, chips, slice_.chips_per_host)
        for program in (p for p in programs() if selected(p.name, programs_wanted)):
            # An engine of the same model, configuration, dtype and slice runs the same prefill
            # whatever it samples with, and the same decode when it samples alike: compiled once.
            key = (role if engine_key is None else engine_key[:3] + engine_key[4:], program.name, program.sampling_mode)
            if key in done:
                reports.append(dataclasses.replace(done[key], role=role))
                log.info("%s: %s is %s's program; not compiled twice", role, program.name, done[key].role)
                continue
            log.info("compiling %s: %s for %s", role, program.name, topology)
            report = compile_program(program, slice_.chip, topology)
            if role == "rollout" and program.name.startswith("decode") and report.compiled:
                report = with_kv_reads(report, config, plan, engine_key[0])
            log.info("%s: %s", program.name, f"{report.compile_s:.0f} s" if report.compiled else report.error)
            reports.append(report)
            done[key] = report
    return reports, hbm, planned


def running_sequences(config, num_pages: int) -> tuple[int, float]:
    """(sequences the rollout engine decodes at once, their mean context in tokens) at the recipe's
    response lengths (``loop.response_lengths``), prompts of the smallest prefill bucket, as the fleet
    simulator takes them (``pipelines.fleet.fleet_shape``)."""
    from rlax_core.planning.memory import concurrent_sequences, mean_occupancy

    engine, budget = config.engine, config.loop.sampling.budget(config.engine)
    lengths = config.loop.response_lengths.sample(budget)
    prompt, occupancy = min(engine.prefill_buckets), mean_occupancy(lengths)
    sequences = concurrent_sequences(num_pages, engine.page_size, engine.num_slots, prompt, max(lengths), occupancy,
                                     engine.admission)
    return sequences, prompt + occupancy


def with_kv_reads(report, config, plan, model):
    """A rollout decode's report with the KV pages its attention reads per step (``compile.decode_step``),
    counted at the recipe's running sequences and mean context."""
    from rlax_core.planning.memory import decode_kv_read_bytes

    engine = config.engine
    kernel = "tpu" if report.program.endswith("(tpu)") else ""
    sequences, context = running_sequences(config, plan.num_pages)
    return dataclasses.replace(report, kv_bytes_per_page=decode_kv_read_bytes(model, engine, [engine.page_size], kernel),
                               page_size=engine.page_size, running_sequences=sequences, mean_context=context)


def decode_step_line(report) -> str | None:
    """One line per rollout decode: its step's bytes with the KV pages read, and the full-width check."""
    step = report.decode_step()
    if step is None:
        return None
    copies = (f"full-width copies of a held array: {len(report.full_width)} ({', '.join(report.full_width[:3])}"
              f"{', ...' if len(report.full_width) > 3 else ''})" if report.full_width
              else "no full-width copy of the KV pool or the weights")
    return (f"{report.role}: {report.program}: one step of {step['running_sequences']} sequences at a mean context of "
            f"{step['mean_context']:,.0f} tokens reads XLA's {step['xla_bytes'] / 1e9:.2f} GB of HBM + KV pages "
            f"{step['kv_read_bytes'] / 1e9:.2f} GB = {step['step_bytes'] / 1e9:.2f} GB per chip, "
            f"{step['step_roofline_s'] * 1e3:.3g} ms roofline; {copies}")


def role_peaks(reports, plans_incoming: dict[str, int]) -> dict[str, int]:
    """XLA's bytes per chip of each role: its largest program, plus the incoming weights a weight
    swap places beside the engine's own (no single program holds them), plus on a rollout chip the
    reward model's and a teacher's forwards (their weights stay beside the engine's; each counted
    whole, as the planner does)."""
    from rlax_core.compile.reward_model import SCORING_PROGRAMS

    peaks: dict[str, int] = {}
    beside: dict[tuple[str, str], int] = {}  # (role, the scoring model's program kind): its largest
    for r in reports:
        if not r.compiled:
            continue
        kind = next((name for name in SCORING_PROGRAMS if r.program.startswith(name)), None)
        if kind is not None and r.role == "rollout":
            beside[r.role, kind] = max(beside.get((r.role, kind), 0), r.peak_bytes)
        else:
            peaks[r.role] = max(peaks.get(r.role, 0), r.peak_bytes)
    roles = {*peaks, *(role for role, _ in beside)}
    return {role: peaks.get(role, 0) + sum(b for (r, _), b in beside.items() if r == role) + plans_incoming.get(role, 0)
            for role in roles}


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from pipelines.config import load_run_config
    from pipelines.plan import memory_plans, pool_occupancy
    from rlax_core.compile.report import format_table
    from rlax_core.config import ConfigError
    from rlax_core.planning.memory import gib

    if beam_args:
        raise ConfigError("", f"rlax compile takes no Beam options; unknown arguments: {' '.join(beam_args)}")
    if not args.config:
        raise ConfigError("", "rlax compile needs --config RECIPE (a recipe with a hardware: section)")
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    config = load_run_config(args.config, args.overrides)
    wanted = tuple(name.strip() for name in args.programs.split(",") if name.strip())
    reports, hbm, planned = compile_roles(config, roles, wanted)
    if wanted and not reports:
        raise ConfigError("programs", f"no program of the roles {', '.join(roles)} is named {args.programs!r}")
    plans = memory_plans(config, roles)
    incoming = {plan.role: plan.parts.get("incoming weights", 0) for plan in plans}
    peaks = role_peaks(reports, incoming)
    print(format_table(reports, hbm, planned))
    print()
    for role, peak in peaks.items():
        print(f"{role}: XLA {gib(peak)} per chip (largest program + incoming weights {gib(incoming.get(role, 0))}) "
              f"against the planner's {gib(planned[role])} ({peak / planned[role]:.2f}x) and {gib(hbm[role])} HBM")
    for plan in (plan for plan in plans if plan.role == "rollout"):
        print(pool_occupancy(config, plan))
    for line in filter(None, map(decode_step_line, reports)):
        print(line)
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump({"config": args.config, "overrides": args.overrides, "roles_asked": list(roles),
                       "programs_asked": list(wanted), "programs": [r.to_json() for r in reports],
                       "roles": {role: {"xla_bytes_per_chip": peak, "planned_bytes_per_chip": planned[role],
                                        "hbm_bytes_per_chip": hbm[role]} for role, peak in peaks.items()}},
                      out, indent=1)
    failed = [r for r in reports if not r.compiled and r.topology != "-"]
    failed += [role for role, peak in peaks.items() if peak > hbm[role]]
    for role, peak in peaks.items():
        if peak > hbm[role]:
            print(f"rlax compile: {role} needs {gib(peak)} per chip, over the {gib(hbm[role])} of HBM", file=sys.stderr)
    return 1 if failed else 0
