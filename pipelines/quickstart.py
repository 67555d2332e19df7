"""``rlax quickstart``: curate -> filter -> RL -> evaluate, on stories260K and the story task, on this machine.

    rlax quickstart --output runs/quickstart
    rlax quickstart --config configs/quickstart_moe.yaml --output runs/quickstart-moe   # the policy a mixture of experts

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

With ``rm.train_before_rl`` (``configs/quickstart_rm.yaml``) the reward is a model made by the run
itself, before RL (``reward_model_stage``): ``rlax rft`` samples the curated training prompts and pairs
a verified completion with a failed one of the same prompt (``DIR/rft``), ``rlax rm`` trains a
Bradley-Terry reward model on those pairs (``DIR/rm``, its final export copied to
``DIR/rm/reward_model``), and the RL run's ``reward_model`` term reads it. The verifier stays in the
reward's terms with weight 0: it pays nothing, and it is what held-out pass@1 and each step's pass
rate are measured by, beside the reward model's score (the report's per-step table).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

HELP = "curate -> filter -> RL -> evaluate on stories260K, all on this machine"

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets"
QUICKSTART_RECIPE = "quickstart.yaml"  # a shipped recipe (pipelines.config.find_config)

HELDOUT_SAMPLES = 8
TARGET_PASS_AT_1 = 0.25
PROGRESS_EVERY_S = 15.0  # how often a running step reports
RM_EPOCHS = 2  # passes of rlax rm over the pairs (tests/training/test_reward_model_story.py: 0.85+ held out)
RM_LEARNING_RATE = 3e-3  # a reward model from stories260K: the rate that test measured
FILTER_TIMEOUT_S = 300.0  # the quickstart's budget is 10 minutes: past this, train on the curated prompts  # the held-out pass@1 the benchmark times runs to


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default="runs/quickstart", help="folder for everything the quickstart writes")
    parser.add_argument("--filter-prompts", type=int, default=256, help="training prompts sampled by the filter")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="fail if the RL run is not done by then")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run already in --output (a folder holding files is refused otherwise)")


def _cli(argv: list[str], log_path: Path, timeout_s: float = 1800, prompts: int | None = None) -> None:
    """Run ``rlax ARGV`` as its own process (each step is the real entry point); fail loudly.

    Every ``PROGRESS_EVERY_S`` it logs how long the step has run and, given ``prompts`` (the most the
    step samples), how many prompts the engine has sampled so far, read from the step's own log.
    """
    from pipelines.failures import JobFailed, job_failed
    from pipelines.lifeline import cli_command, spawn_job

    log.info("quickstart: %s (log: %s)", " ".join(argv[:1] + [a for a in argv[1:] if not a.startswith("/")][:6]),
             log_path)
    started = time.monotonic()
    process = spawn_job(cli_command(argv), log_path)  # owned: the step dies with the quickstart, however it dies
    while True:
        try:
            code = process.wait(timeout=PROGRESS_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                os.killpg(process.pid, signal.SIGKILL)  # the step and what it started
                process.wait()
                raise JobFailed(f"the rlax {argv[0]} job did not finish within {timeout_s:.0f} s; its log: {log_path}") from None
            sampled = "" if prompts is None else f", {prompts_sampled(log_path)} of {prompts} prompts sampled"
            log.info("quickstart: rlax %s running for %.0f s%s", argv[0], elapsed, sampled)
    if code != 0:
        raise job_failed(f"rlax {argv[0]}", code, log_path)


# EngineHost.complete (rlax_core.rollout.host) logs one line per engine batch: "MODEL: N prompt(s) x K sample(s), ..."
_SAMPLED_BATCH = re.compile(rb": (\d+) prompt\(s\) x \d+ sample\(s\)")


def prompts_sampled(log_path: Path) -> int:
    return sum(int(n) for n in _SAMPLED_BATCH.findall(log_path.read_bytes()))


def stop_token_ids(tokenizer) -> list[int]:
    """A paragraph ends at a newline; a story at BOS (llama2.c's delimiter) or EOS."""
    ids = {tokenizer.bos_id, tokenizer.eos_id, tokenizer.token_to_id("<0x0A>")}
    ids |= {tokenizer.encode("\n")[-1]} if tokenizer.encode("\n") else set()
    return sorted(i for i in ids if i is not None)


def curate(output: Path) -> Path:
    config = {
        "inputs": [{"path": str(ASSETS / "story_task" / "train.jsonl"), "format": "generic", "source": "story_word",
                    "split": "train", "mapping": {"prompt": "prompt", "answer": "answer", "task": "story"}}],
        "decontaminate_against": [{"path": str(ASSETS / "story_task" / "heldout.jsonl"), "format": "generic",
                                   "source": "story_heldout",
                                   "mapping": {"prompt": "prompt", "answer": "answer", "task": "story"}}],
        "output": str(output / "curated"),
    }
    path = output / "configs" / "curate.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    _cli(["curate", "--config", str(path)], output / "logs" / "curate.log")
    return output / "curated"


def filter_prompts(output: Path, curated: Path, model_path: str, stops_text: list[str], limit: int) -> Path | None:
    """``rlax filter`` over the curated prompts; None (and the reason logged) when it cannot run."""
    config = {
        "input": str(curated / "examples-*.parquet"),
        "output": str(output / "filtered"),
        "generation": {"model": model_path, "sampling": {"samples_per_prompt": 4, "max_new_tokens": 64,
                                                          "stop_strings": stops_text}, "batch_size": 32, "engine": {"num_slots": 64, "num_pages": 640, "max_prompt_len": 64,
                                                    "max_new_tokens": 64, "prefill_buckets": [32, 64]}},
        "low": 0.0, "high": 0.75, "limit": limit,
    }
    path = output / "configs" / "filter.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        # --allow-empty: a band that keeps no prompt is not a failure here; training falls back to the curated ones
        _cli(["filter", "--config", str(path), "--allow-empty"], output / "logs" / "filter.log",
             timeout_s=FILTER_TIMEOUT_S, prompts=limit)
    except RuntimeError as error:
        log.warning("quickstart: the difficulty filter did not run (%s); training on the curated prompts",
                    str(error).splitlines()[0])
        return None
    return output / "filtered"


def evaluate(model_config, params, base_params, tokenizer, examples, run_config, stops) -> dict[str, Any]:
    from rlax_core.eval.policy import evaluate_policy

    return evaluate_policy(model_config, params, tokenizer, examples, rewards=run_config.loop.named_rewards(),
                           engine=run_config.engine,
                           samples=HELDOUT_SAMPLES, ks=(1, HELDOUT_SAMPLES), stop_token_ids=stops,
                           seed=run_config.run.seed + 1, base_params=base_params)


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
        f"{report['rl']['seconds']:.0f} s.",
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
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from rlax_core.config import require
    from pipelines.run_folder import claim

    require(args.filter_prompts >= 1, "--filter-prompts", f"a number of prompts >= 1, got {args.filter_prompts}")
    require(args.timeout_s > 0, "--timeout-s", f"seconds > 0, got {args.timeout_s:g}")
    output = Path(args.output).resolve()
    resumed = claim(output, resume=args.resume)  # before the imports below: a minute on a busy machine
    if resumed:
        log.info("quickstart: resuming the run in %s (its curated and filtered prompts, checkpoints and "
                 "rollouts are reused)", output)

    import jax

    from pipelines.config import find_config, load_run_config
    from pipelines.initial_policy import prepare_policy
    from pipelines.launch import launch
    from rlax_core.data.rollout_store import RolloutStore
    from rlax_core.rollout.loop_metrics import loop_metrics
    from rlax_core.data.training_set import read_examples
    from rlax_core.models import from_pretrained
    from rlax_core.models.tokenizer import load_tokenizer
    from rlax_core.weights.adapters import load_version
    from rlax_core.weights.store import WeightStore

    for folder in ("configs", "logs"):
        (output / folder).mkdir(parents=True, exist_ok=True)
    config_path = str(find_config(args.config or QUICKSTART_RECIPE).resolve())
    overrides = [f"run.output_dir={output / 'run'}", *args.overrides]
    run_config = load_run_config(config_path, overrides)
    if run_config.rm.train_before_rl:  # the reward model this run makes, where the stage below puts it
        overrides.append(f"loop.rewards.reward_model.path={output / 'rm' / 'reward_model'}")
        run_config = load_run_config(config_path, overrides)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    # The policy the filter samples, the evaluation starts from and the run trains: with model.upcycle,
    # the mixture of experts made here once (a resumed run reuses it).
    model_path = prepare_policy(run_config)
    if run_config.model.upcycle is not None:
        seconds["upcycle"] = time.monotonic() - started
    tokenizer = load_tokenizer(model_path)
    stops = stop_token_ids(tokenizer)
    overrides.append(f"loop.sampling.stop_token_ids={stops}")

    # A resumed run keeps the prompts it was trained on: curate and filter run only when their output
    # is missing (a second curate into the same folder would add shards beside the first ones).
    mark = time.monotonic()
    curated = output / "curated" if resumed and read_examples_or_none(output / "curated") else curate(output)
    seconds["curate"] = time.monotonic() - mark
    mark = time.monotonic()
    filtered = (output / "filtered" if resumed and read_examples_or_none(output / "filtered")
                else filter_prompts(output, curated, model_path, ["\n"], args.filter_prompts))
    seconds["filter"] = time.monotonic() - mark
    train_set = filtered if filtered is not None and read_examples_or_none(filtered) else curated
    log.info("quickstart: training on %d prompts from %s", len(read_examples(str(train_set))), train_set)

    if run_config.rm.train_before_rl:
        mark = time.monotonic()
        reward_model_stage(output, config_path, overrides, curated, run_config)
        seconds["reward_model"] = time.monotonic() - mark

    heldout = [json.loads(line) for line in (ASSETS / "story_task" / "heldout.jsonl").read_text().splitlines()]
    base = from_pretrained(model_path)
    mark = time.monotonic()
    before = evaluate(base.config, base.params, base.params, tokenizer, heldout, run_config, stops)
    seconds["evaluate_before"] = time.monotonic() - mark
    log.info("quickstart: before RL held-out pass@1 %.3f +- %.3f", before["pass@1"], before["pass@1_se"])

    mark = time.monotonic()
    where = launch(config_path, overrides, beam_args, train_set=str(train_set), timeout_s=args.timeout_s,
                   resume=resumed)
    seconds["rl"] = time.monotonic() - mark

    store = WeightStore(run_config.weight_store())
    final_version = store.latest()
    # A LoRA run's versions are adapters: load_version merges them into their base version.
    final_params = jax.tree.map(jax.numpy.asarray, load_version(store, final_version)[0])
    store.close()
    export_final_model(load_run_config(config_path, overrides), base.config, final_params, output / "final_model")
    mark = time.monotonic()
    after = evaluate(base.config, final_params, base.params, tokenizer, heldout, run_config, stops)
    seconds["evaluate_after"] = time.monotonic() - mark
    seconds["total"] = time.monotonic() - started

    rows = loop_metrics(run_config.metrics_dir(), RolloutStore(run_config.rollout_root(), run_config.run.name))
    reward_curve(rows, output / "reward_curve.png")
    report = {
        "task": "continue the story with one paragraph that ends within 64 tokens, repeats no word 3-gram, "
                "and uses the word 'happy' exactly once (reward: pass = 1, else half-credit for each half)",
        "model": model_path,
        "policy": policy_summary(base.config),
        "resumed": resumed,  # true: this report continues a run that was already in the folder
        "before": before,
        "after": after,
        "pass@1_gain_in_se": significance(before, after),
        "target_pass@1": TARGET_PASS_AT_1,
        "rl": {**rl_settings(run_config), "final_weight_version": final_version, "seconds": seconds["rl"]},
        "learned_reward": learned_reward_steps(rows),
        "seconds": seconds,
        "where": {**where, "final_model": str(output / "final_model")},
    }
    (output / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    (output / "report.md").write_text(markdown(report))
    print(markdown(report))
    print(f"rlax quickstart: report in {output / 'report.md'} and {output / 'report.json'}")
    return 0


def export_final_model(run_config, model_config, params, folder: Path) -> None:
    """The trained policy as a complete Hugging Face folder, by the trainer's own exporter (weights,
    config, tokenizer, generation settings), so ``rlax generate --model DIR/final_model`` reads it."""
    from pipelines.train import hf_export
    from rlax_core.models.export import export_hf

    recipe = hf_export(run_config, model_config)
    export_hf(folder, model_config, params, tokenizer_source=recipe.tokenizer_source, generation=recipe.generation)


def read_examples_or_none(path: Path):
    from rlax_core.data.training_set import read_examples

    try:
        return read_examples(str(path))
    except FileNotFoundError:
        return None


def reward_model_stage(output: Path, config_path: str, overrides: list[str], curated: Path, run_config) -> Path:
    """``rm.train_before_rl``: pairs from ``rlax rft`` (a verified against a failed completion of one
    training prompt), then ``rlax rm`` on them; the model is copied to ``DIR/rm/reward_model``, the
    path the run's ``reward_model`` term was given. A resumed run keeps the pairs and the model it made."""
    import shutil

    rft_dir, rm_dir = output / "rft", output / "rm"
    final = rm_dir / "reward_model"
    if (final / "config.json").exists():
        return final
    if not (rft_dir / "stats.json").exists():
        _cli(["rft", "--config", config_path, *overrides, f"rft.input={curated}/examples-*.parquet",
              f"rft.output={rft_dir}"], output / "logs" / "rft.log", prompts=run_config.rft.limit or None)
    pairs = json.loads((rft_dir / "stats.json").read_text())["pairs"]
    settings = run_config.rm
    steps = max(1, math.ceil(RM_EPOCHS * pairs * (1 - settings.validation_fraction) / settings.pairs_per_step))
    _cli(["rm", "--config", config_path, *overrides, f"run.output_dir={rm_dir}", f"rm.data={rft_dir}/pairs-*.parquet",
          f"trainer.total_steps={steps}", f"trainer.checkpoint_every={steps}",
          f"trainer.optimizer.learning_rate={RM_LEARNING_RATE}"], output / "logs" / "rm.log")
    shutil.copytree(rm_dir / "hf" / f"step_{steps:08d}", final)
    log.info("quickstart: reward model trained on %d pairs in %d steps: %s", pairs, steps, final)
    return final


def learned_reward_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step, the reward model's mean score beside the verifier's pass rate and their correlation."""
    return [{"step": r["step"], "reward_model_mean": r["rollout/reward_model_mean"],
             "pass_rate": r.get("rollout/pass_rate"),
             "correlation": r.get("rollout/reward_model_pass_correlation")}
            for r in rows if r.get("rollout/reward_model_mean") is not None]


def learned_reward_table(steps: list[dict[str, Any]]) -> list[str]:
    if not steps:
        return []
    number = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return ["", "## The reward model's score and the verifier, per step", "",
            "The reward is the reward model's score alone; the verifier pays nothing and measures. A score "
            "that rises while the pass rate does not, or a correlation near zero, is the reward being hacked.", "",
            "| step | reward model score (normalised) | verifier pass rate | correlation |", "|---|---|---|---|",
            *[f"| {s['step']} | {number(s['reward_model_mean'])} | {number(s['pass_rate'])} | "
              f"{number(s['correlation'])} |" for s in steps]]
