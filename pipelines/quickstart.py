"""``rlax quickstart``: curate -> filter -> RL -> evaluate, on stories260K and the story task, on this machine.

    rlax quickstart --output runs/quickstart
    rlax quickstart --config configs/quickstart_moe.yaml --output runs/quickstart-moe   # the policy a mixture of experts
    rlax quickstart --config configs/quickstart_warm.yaml --output runs/quickstart-warm  # RFT -> SFT -> RL

The task (``rlax_core.tasks.story``): continue a story opening with one paragraph that ends on its
own within 64 tokens, repeats no phrase, and uses the word "happy" exactly once. stories260K passes
about 5% of the time; repetition cannot win it. The steps, each the real entry point:

1. ``rlax curate``   the bundled prompts (``pipelines/assets/story_task/``): dedup, near-dedup and
                     decontamination against the held-out prompts;
2. ``rlax filter``   sample each training prompt with the base model, keep a pass-rate band;
3. evaluate before   held-out prompts (names and scenes training never sees): pass@1 with its
                     standard error, pass@8, mean reward, fluency (NLL under the base model, distinct-n);
4. ``rlax launch``   the trainer job and the streaming rollout pipeline together (GRPO with a KL term);
5. evaluate after    the final weights, exported as a complete Hugging Face folder (``DIR/final_model``:
                     weights, config, tokenizer, generation settings; ``rlax generate --model`` reads it);
6. report            ``DIR/report.json`` (``before`` / ``after``, ``policy``: its architecture, parameters
                     and experts), ``DIR/report.md``, ``DIR/reward_curve.png``.

With ``model.upcycle`` (``configs/quickstart_moe.yaml``) the policy is made first: stories260K upcycled
into a mixture of experts in ``DIR/run/upcycled_model`` (``pipelines.initial_policy``), which every
step then samples, evaluates and trains.

A recipe that names ``stages`` (``pipelines.stages``) runs those instead, in its order, by the runners
of ``pipelines.quickstart_stages``; ``configs/quickstart_warm.yaml`` adds ``rlax rft`` and ``rlax sft``
before the filter, starts RL from the SFT job's final version, runs the plain RL beside it, and its
report adds pass@1 after SFT, the held-out NLL of held-out verified samples before and after SFT, and
each run's RL steps to the target pass@1 (docs/post_training.md). ``configs/quickstart_rm.yaml`` lists
an ``rm`` stage: the run makes its own reward model before RL (``rlax rft`` pairs a verified completion
with a failed one of the same prompt, ``rlax rm`` trains a Bradley-Terry model on them, copied to
``DIR/rm/reward_model``) and RL is paid by that model's score alone; the verifier stays in the reward's
terms with weight 0 and measures, beside the model's score, each step (the report's per-step table).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipelines.quickstart_stages import (  # noqa: F401  (the quickstart's names, where they always were)
    ASSETS, HELDOUT_SAMPLES, TARGET_PASS_AT_1, evaluate, learned_reward_steps, learned_reward_table,
    read_examples_or_none, stop_token_ids)

HELP = "curate -> filter -> RL -> evaluate on stories260K, all on this machine"

QUICKSTART_RECIPE = "quickstart.yaml"  # a shipped recipe (pipelines.config.find_config)

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default="runs/quickstart", help="folder for everything the quickstart writes")
    parser.add_argument("--filter-prompts", type=int, default=256, help="training prompts sampled by the filter")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="fail if the RL run is not done by then")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run already in --output (a folder holding files is refused otherwise)")
    parser.add_argument("--curve-every", type=int, default=5,
                        help="warm start: score every N-th RL weight version for the steps to the target pass@1")
    parser.add_argument("--no-cold", action="store_true",
                        help="warm start: skip the plain (cold) RL run the report compares against")


def policy_summary(model_config) -> dict[str, Any]:
    """What the report says of the policy's shape: a dense model, or a mixture of experts and how sparse."""
    moe = model_config.moe
    return {"architecture": model_config.architecture, "parameters": model_config.num_params,
            "active_parameters": model_config.num_active_params,
            "num_experts": moe.num_experts if moe else 0, "experts_per_token": moe.experts_per_token if moe else 0}


def rl_settings(run_config) -> dict[str, Any]:
    """What the report says of the RL run, read from the run's config."""
    trainer = run_config.trainer
    return {"steps": trainer.total_steps, "groups_per_step": trainer.groups_per_step,
            "samples_per_prompt": run_config.loop.sampling.samples_per_prompt, "max_staleness": trainer.max_staleness,
            "algorithm": run_config.algorithm.name}


def significance(before: dict[str, Any], after: dict[str, Any]) -> float:
    """How many standard errors (of the difference) held-out pass@1 rose by."""
    se = math.sqrt(before["pass@1_se"] ** 2 + after["pass@1_se"] ** 2)
    return (after["pass@1"] - before["pass@1"]) / se if se > 0 else float("inf")


def reward_curve(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows if r.get("rollout/reward_mean") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["rollout/reward_mean"] for r in rows if r.get("rollout/reward_mean") is not None],
            label="mean reward")
    ax.plot(steps, [r["rollout/pass_rate"] for r in rows if r.get("rollout/reward_mean") is not None],
            label="pass rate")
    ax.set_xlabel("schedule step")
    ax.set_ylim(0, 1)
    ax.set_title("stories260K, story task: training rollouts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


METRICS = ("pass@1", "pass@1_se", "pass@8", "reward_mean", "nll_base", "distinct_1", "distinct_2",
           "response_length_mean")


def policy_line(policy: dict[str, Any]) -> str:
    line = f"{policy['architecture']}, {policy['parameters']:,} parameters"
    if policy["num_experts"]:
        line += (f" ({policy['active_parameters']:,} active per token: {policy['experts_per_token']} of "
                 f"{policy['num_experts']} experts per layer)")
    return line


def markdown(report: dict[str, Any]) -> str:
    before, after = report["before"], report["after"]
    lines = [
        "# RLAX quickstart: stories260K learns the story task",
        "",
        f"Task: {report['task']}",
        "",
        f"Policy: {policy_line(report['policy'])}.",
        "",
        f"Held-out prompts: {before['prompts']} x {before['samples_per_prompt']} samples. "
        f"RL: {report['rl']['steps']} GRPO steps ({report['rl']['groups_per_step']} prompts x "
        f"{report['rl']['samples_per_prompt']} samples), max staleness k={report['rl']['max_staleness']}, "
        f"{report['rl']['seconds'] or 0:.0f} s.",
        *(["", "This run was resumed (`--resume`): it continued the run already in this folder, so its RL "
               "time and reward curve count only what this invocation did on top of it."]
          if report.get("resumed") else []),
        "",
        "| metric | before | after |",
        "|---|---|---|",
        *[f"| {m} | {before.get(m, float('nan')):.3f} | {after.get(m, float('nan')):.3f} |" for m in METRICS],
        "",
        f"Held-out pass@1 rose by **{report['pass@1_gain_in_se']:.1f} standard errors**. "
        "Fluency: `nll_base` is the per-token NLL of the completions under the base model (lower is more "
        "TinyStories-like), distinct-n the share of distinct word n-grams.",
        "",
        "![reward curve](reward_curve.png)",
        *learned_reward_table(report.get("learned_reward", [])),
        "",
        "## Samples after RL",
        "",
        *[f"- *{e['prompt']}* {e['completion'].strip()}" for e in after.get("examples", [])[:5]],
        "",
        "## Time per stage (s)",
        "",
        "| stage | seconds |",
        "|---|---|",
        *[f"| {k} | {v:.1f} |" for k, v in report["seconds"].items()],
        "",
        "`total` is the stages' wall time: `evaluate_before` runs beside the first stages.",
    ]
    return "\n".join(lines) + "\n"


def warm_markdown(report: dict[str, Any]) -> str:
    """The warm-start section: RFT data, SFT's held-out NLL, pass@1 base / after SFT / after RL beside
    the cold run, and the RL steps each took to the target pass@1."""
    rft, sft, before, after = report.get("rft", {}), report["sft"], report["before"], report["after"]
    cold, warm, target, steps = report.get("cold", {}), report.get("warm", {}), report["target_pass@1"], report["rl"]["steps"]

    def reached(run: dict[str, Any]) -> str:
        if "curve" not in run:
            return "not run"
        return f"{run['steps_to_target']}" if run["steps_to_target"] is not None else f"not within {steps}"

    rows = [("base model", before, "")]
    rows.append(("after SFT, before any RL", sft, ""))
    if "curve" in cold:
        cold_after = cold["curve"][-1]
        rows.append((f"cold: RL from the base (the plain quickstart), {steps} steps", cold_after, reached(cold)))
    rows.append((f"warm: RL from the SFT policy, {steps} steps", after, reached(warm)))
    lines = [
        "", "## Warm start: RFT -> SFT -> RL", "",
        f"Stages: {' -> '.join(report['stages'])}.",
    ]
    if rft:
        lines.append(f"RFT: the base model sampled {rft['prompts']} training prompts x {rft['samples_per_prompt']}; "
                     f"{rft['sft_examples']} verified samples from {rft['prompts_with_data']} prompts became SFT rows "
                     f"(mean pass rate {rft['mean_pass_rate']:.3f}).")
    lines += [
        f"SFT: {sft['steps']} steps of {sft['examples_per_step']} examples, learning rate {sft['learning_rate']:g}, "
        f"{sft['seconds']:.0f} s. Held-out NLL of {sft['heldout_examples']} held-out verified samples (nats per "
        f"completion token): **{sft['heldout_nll_before']:.3f} before SFT -> {sft['heldout_nll_after']:.3f} after**.",
        "", f"| policy (held-out prompts) | pass@1 | pass@1 se | RL steps to pass@1 >= {target} |", "|---|---|---|---|",
        *[f"| {name} | {stats['pass@1']:.3f} | {stats['pass@1_se']:.3f} | {steps_cell} |" for name, stats, steps_cell in rows],
    ]
    if "curve" in warm:
        cold_at = {p["step"]: p["pass@1"] for p in cold.get("curve", [])}
        lines += ["", "| RL step | cold pass@1 | warm pass@1 |", "|---|---|---|",
                  *[f"| {p['step']} | {cold_at[p['step']]:.3f} | {p['pass@1']:.3f} |" if p["step"] in cold_at
                    else f"| {p['step']} | | {p['pass@1']:.3f} |" for p in warm["curve"]]]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from rlax_core.config import require
    from pipelines.run_folder import claim

    require(args.filter_prompts >= 1, "--filter-prompts", f"a number of prompts >= 1, got {args.filter_prompts}")
    require(args.timeout_s > 0, "--timeout-s", f"seconds > 0, got {args.timeout_s:g}")
    require(args.curve_every >= 1, "--curve-every", f"a number of steps >= 1, got {args.curve_every}")
    output = Path(args.output).resolve()
    resumed = claim(output, resume=args.resume)  # before the imports below: a minute on a busy machine
    if resumed:
        log.info("quickstart: resuming the run in %s (its curated and filtered prompts, checkpoints and "
                 "rollouts are reused)", output)

    from pipelines.config import find_config, load_run_config
    from pipelines.initial_policy import prepare_policy
    from pipelines.quickstart_stages import RUNNERS, QuickstartRun, evaluate_base
    from pipelines.stages import DEFAULT_STAGES
    from rlax_core.data.rollout_store import RolloutStore
    from rlax_core.rollout.loop_metrics import loop_metrics
    from rlax_core.models import from_pretrained
    from rlax_core.models.tokenizer import load_tokenizer
    from rlax_core.utils.compile_cache import enable_compilation_cache

    for folder in ("configs", "logs"):
        (output / folder).mkdir(parents=True, exist_ok=True)
    config_path = str(find_config(args.config or QUICKSTART_RECIPE).resolve())
    overrides = [f"run.output_dir={output / 'run'}", *args.overrides]
    run_config = load_run_config(config_path, overrides)
    if "rm" in run_config.stages:  # the reward model this run makes, where its rm stage puts it
        overrides.append(f"loop.rewards.reward_model.path={output / 'rm' / 'reward_model'}")
        run_config = load_run_config(config_path, overrides)
    started = time.monotonic()
    # The policy the filter samples, the evaluation starts from and the run trains: with model.upcycle,
    # the mixture of experts made here once (a resumed run reuses it).
    model_path = prepare_policy(run_config)
    upcycled = time.monotonic() - started
    tokenizer = load_tokenizer(model_path)
    stops = stop_token_ids(tokenizer)
    overrides.append(f"loop.sampling.stop_token_ids={stops}")
    heldout = [json.loads(line) for line in (ASSETS / "story_task" / "heldout.jsonl").read_text().splitlines()]
    # The evaluations compile the engine in this process: from the cache the run's other jobs share.
    enable_compilation_cache(run_config.run.compilation_cache_dir, enabled=run_config.run.compilation_cache)
    require(not run_config.stages or run_config.stages[-1] == "evaluate", "stages",
            "the quickstart's report is made by its evaluate stage: end the stages with evaluate")
    q = QuickstartRun(output=output, config_path=config_path, overrides=overrides, run_config=run_config,
                      beam_args=beam_args, filter_prompts=args.filter_prompts, timeout_s=args.timeout_s,
                      resumed=resumed, model_path=model_path, tokenizer=tokenizer, stops=stops, heldout=heldout,
                      base=from_pretrained(model_path), stages=run_config.stages or DEFAULT_STAGES,
                      compare_cold=not args.no_cold, curve_every=args.curve_every)
    if run_config.model.upcycle is not None:
        q.seconds["upcycle"] = upcycled
    with ThreadPoolExecutor(1, thread_name_prefix="evaluate-base") as beside:
        # The base's held-out figures need only the base, the held-out prompts and the run's rewards:
        # they are computed beside the first stages (jobs of their own, which leave this process
        # waiting), not before RL; unless an rm stage makes the reward model those rewards score with.
        if "rm" not in q.stages:
            q.base_evaluation = beside.submit(evaluate_base, q)
        for stage in q.stages:  # pipelines.stages: the recipe's order (checked as it loaded)
            RUNNERS[stage](q)
    q.seconds["total"] = time.monotonic() - started

    rows = []
    if q.final_version is not None:
        export_final_model(load_run_config(config_path, overrides), q.base.config, q.final_params,
                           output / "final_model")
        rows = loop_metrics(run_config.metrics_dir(), RolloutStore(run_config.rollout_root(), run_config.run.name))
        reward_curve(rows, output / "reward_curve.png")
    report = {
        "task": "continue the story with one paragraph that ends within 64 tokens, repeats no word 3-gram, "
                "and uses the word 'happy' exactly once (reward: pass = 1, else half-credit for each half)",
        "model": model_path,
        "policy": policy_summary(q.base.config),
        "resumed": resumed,  # true: this report continues a run that was already in the folder
        "stages": list(q.stages),
        **q.report,
        "pass@1_gain_in_se": significance(q.report["before"], q.report["after"]),
        "target_pass@1": TARGET_PASS_AT_1,
        "rl": {**rl_settings(run_config), "final_weight_version": q.final_version, "seconds": q.seconds.get("rl")},
        "learned_reward": learned_reward_steps(rows),
        "seconds": q.seconds,
        "where": {**q.where, "final_model": str(output / "final_model")},
    }
    (output / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    text = markdown(report) + (warm_markdown(report) if "sft" in report else "")
    (output / "report.md").write_text(text)
    print(text)
    print(f"rlax quickstart: report in {output / 'report.md'} and {output / 'report.json'}")
    return 0


def export_final_model(run_config, model_config, params, folder: Path) -> None:
    """The trained policy as a complete Hugging Face folder, by the trainer's own exporter (weights,
    config, tokenizer, generation settings), so ``rlax generate --model DIR/final_model`` reads it."""
    from pipelines.train import hf_export
    from rlax_core.models.export import export_hf

    recipe = hf_export(run_config, model_config)
    export_hf(folder, model_config, params, tokenizer_source=recipe.tokenizer_source, generation=recipe.generation)
