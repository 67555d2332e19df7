"""The quickstart's stages (``pipelines.stages`` names them; ``pipelines.quickstart`` runs them in order).

Each runner takes the run's state (``QuickstartRun``), runs one real entry point in its own process
(``rlax curate``, ``rlax rft``, ``rlax sft``, ``rlax filter``, ``rlax launch``) or the held-out
evaluation, and leaves what the next stage reads: the curated prompts, the training set, and the
policy later stages sample and train. After ``sft`` that policy is the SFT job's final Hugging Face
export (``OUTPUT/sft/hf/step_N``): the filter samples it and the RL stage starts from it (warm start).

A warm-started run also trains the plain quickstart's RL beside it (``OUTPUT/run_cold``: the same
recipe, prompts, steps and seed, from the base model), keeps every weight version of both runs, and
scores every ``curve_every``-th one on the held-out prompts after training, so its report says how
many RL steps each needed to reach the target pass@1 (evaluation costs no training time).

The steps' shared helpers live here too (``run_step``, one ``rlax`` command as an owned process with
its progress logged, is ``pipelines.lifeline``'s): the story task's ``curate`` and ``filter_prompts`` configs, and the held-out ``evaluate``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import yaml

from pipelines.lifeline import run_step

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets"

HELDOUT_SAMPLES = 8
TARGET_PASS_AT_1 = 0.25  # the held-out pass@1 the benchmarks (and the warm report) count steps to
FILTER_TIMEOUT_S = 300.0  # the quickstart's budget is 10 minutes: past this, train on the curated prompts
RM_EPOCHS = 2  # passes of rlax rm over the pairs (tests/training/test_reward_model_story.py: 0.85+ held out)
RM_LEARNING_RATE = 3e-3  # a reward model from stories260K: the rate that test measured


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
    run_step(["curate", "--config", str(path)], output / "logs" / "curate.log")
    return output / "curated"


def filter_prompts(output: Path, curated: Path, model_path: str, stops_text: list[str], limit: int,
                   engine: dict[str, Any]) -> Path | None:
    """``rlax filter`` over the curated prompts on ``engine`` (the run's ``engine:`` section: the same
    programs, so the evaluations and the rollout workers load from the compilation cache what the
    filter compiled); None (and the reason logged) when it cannot run."""
    config = {
        "input": str(curated / "examples-*.parquet"),
        "output": str(output / "filtered"),
        "generation": {"model": model_path, "sampling": {"samples_per_prompt": 4, "max_new_tokens": 64,
                                                          "stop_strings": stops_text}, "batch_size": 32, "engine": engine},
        "low": 0.0, "high": 0.75, "limit": limit,
    }
    path = output / "configs" / "filter.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        # --allow-empty: a band that keeps no prompt is not a failure here; training falls back to the curated ones
        run_step(["filter", "--config", str(path), "--allow-empty"], output / "logs" / "filter.log",
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


def read_examples_or_none(path: Path):
    from rlax_core.data.training_set import read_examples

    try:
        return read_examples(str(path))
    except FileNotFoundError:
        return None


@dataclasses.dataclass
class QuickstartRun:
    output: Path
    config_path: str
    overrides: list[str]  # every job's: the run folder, the stop tokens, the user's own
    run_config: Any
    beam_args: list[str]
    filter_prompts: int
    timeout_s: float
    resumed: bool
    model_path: str  # the base policy (with model.upcycle: the mixture made from it)
    tokenizer: Any
    stops: list[int]
    heldout: list[dict]
    base: Any  # the base policy, loaded: the fluency reference of every evaluation
    stages: tuple[str, ...]
    compare_cold: bool = True
    curve_every: int = 5
    policy: str = ""  # what the next stage samples and trains
    curated: Path | None = None
    train_set: Path | None = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    where: dict[str, str] = dataclasses.field(default_factory=dict)
    final_params: Any = None
    final_version: int | None = None
    base_evaluation: Future | None = None  # evaluate_base, running beside the first stages

    def __post_init__(self):
        self.policy = self.policy or self.model_path

    @property
    def warm(self) -> bool:
        from pipelines.stages import warm_start

        return warm_start(self.stages)

    def stage_overrides(self, stage: str) -> list[str]:
        return list(self.run_config.stage_overrides.get(stage, ()))

    def timed(self, key: str, work: Callable[[], Any]) -> Any:
        mark = time.monotonic()
        try:
            return work()
        finally:
            self.seconds[key] = time.monotonic() - mark


def curate_stage(q: QuickstartRun) -> None:
    # A resumed run keeps the prompts it was trained on (a second curate would add shards beside the first)
    q.curated = q.timed("curate", lambda: q.output / "curated" if q.resumed and read_examples_or_none(
        q.output / "curated") else curate(q.output))
    q.train_set = q.curated


def engine_section(run_config) -> dict[str, Any]:
    """The run's ``engine:`` section as a config file spells it (lists, not tuples)."""
    return json.loads(json.dumps(dataclasses.asdict(run_config.engine)))


def filter_stage(q: QuickstartRun) -> None:
    from rlax_core.data.training_set import read_examples

    filtered = q.timed("filter", lambda: q.output / "filtered" if q.resumed and read_examples_or_none(
        q.output / "filtered") else filter_prompts(q.output, q.curated, q.policy, ["\n"], q.filter_prompts,
                                  engine_section(q.run_config)))
    q.train_set = filtered if filtered is not None and read_examples_or_none(filtered) else q.curated
    log.info("quickstart: training on %d prompts from %s", len(read_examples(str(q.train_set))), q.train_set)


def rft_stage(q: QuickstartRun) -> None:
    """``rlax rft`` over the curated prompts with the current policy as the generator: its verified
    samples are the SFT set (the recipe's ``rft:`` section says how many samples, rows, which first)."""
    out = q.output / "rft"
    if not (q.resumed and (out / "stats.json").is_file()):
        argv = ["rft", "--config", q.config_path, *q.overrides, f"rft.input={q.curated}/examples-*.parquet",
                f"rft.output={out}", f"rft.generator={q.policy}", *q.stage_overrides("rft")]
        limit = q.run_config.rft.limit or None
        q.timed("rft", lambda: run_step(argv, q.output / "logs" / "rft.log", timeout_s=q.timeout_s, prompts=limit))
    q.report["rft"] = json.loads((out / "stats.json").read_text())


def sft_stage(q: QuickstartRun) -> None:
    """``rlax sft`` on the RFT rows (or the recipe's ``sft.data``) from the current policy; its final
    export becomes the policy. Held-out NLL of the held-out verified samples before and after."""
    from pipelines.config import load_run_config
    from pipelines.sft import split_records
    from rlax_core.utils.metrics import read_metrics

    out = q.output / "sft"
    data = q.run_config.sft.data or str(q.output / "rft" / "sft-*.parquet")
    overrides = [*q.overrides, f"sft.data={data}", f"model.path={q.policy}", *q.stage_overrides("sft")]
    argv = ["sft", "--config", q.config_path, "--output", str(out), *overrides]
    q.timed("sft", lambda: run_step(argv, q.output / "logs" / "sft.log", timeout_s=q.timeout_s))
    config = load_run_config(q.config_path, [*overrides, f"run.output_dir={out}"])
    steps = config.trainer.total_steps
    nll = [(row["step"], row["train/heldout_nll"]) for row in read_metrics(config.metrics_dir())
           if "train/heldout_nll" in row]
    _, held_out = split_records(config.sft.data, config.sft.validation_data, config.sft.validation_fraction,
                                "SftExample", ("id",))
    q.policy = str(out / "hf" / f"step_{steps:08d}")
    q.report["sft"] = {"steps": steps, "examples_per_step": config.sft.examples_per_step,
                       "learning_rate": config.trainer.optimizer.learning_rate, "model": q.policy,
                       "heldout_examples": len(held_out), "heldout_nll_before": nll[0][1] if nll else None,
                       "heldout_nll_after": nll[-1][1] if nll else None, "seconds": q.seconds["sft"]}
    log.info("quickstart: SFT %d steps; held-out NLL of verified samples %s -> %s", steps,
             q.report["sft"]["heldout_nll_before"], q.report["sft"]["heldout_nll_after"])


def rm_stage(q: QuickstartRun) -> None:
    """Pairs from ``rlax rft`` (a verified against a failed completion of one training prompt), then
    ``rlax rm`` on them; the model is copied to ``DIR/rm/reward_model``, the path the run's
    ``reward_model`` term was given. A resumed run keeps the pairs and the model it made."""
    import shutil

    rft_dir, rm_dir = q.output / "rft", q.output / "rm"
    final = rm_dir / "reward_model"
    if (final / "config.json").exists():
        return
    mark = time.monotonic()
    if not (rft_dir / "stats.json").exists():
        run_step(["rft", "--config", q.config_path, *q.overrides, f"rft.input={q.curated}/examples-*.parquet",
                  f"rft.output={rft_dir}", *q.stage_overrides("rm")], q.output / "logs" / "rft.log",
                 timeout_s=q.timeout_s, prompts=q.run_config.rft.limit or None)
    pairs = json.loads((rft_dir / "stats.json").read_text())["pairs"]
    settings = q.run_config.rm
    steps = max(1, math.ceil(RM_EPOCHS * pairs * (1 - settings.validation_fraction) / settings.pairs_per_step))
    run_step(["rm", "--config", q.config_path, *q.overrides, f"run.output_dir={rm_dir}",
              f"rm.data={rft_dir}/pairs-*.parquet", f"trainer.total_steps={steps}", f"trainer.checkpoint_every={steps}",
              f"trainer.optimizer.learning_rate={RM_LEARNING_RATE}", *q.stage_overrides("rm")],
             q.output / "logs" / "rm.log", timeout_s=q.timeout_s)
    shutil.copytree(rm_dir / "hf" / f"step_{steps:08d}", final)
    q.seconds["reward_model"] = time.monotonic() - mark
    log.info("quickstart: reward model trained on %d pairs in %d steps: %s", pairs, steps, final)


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


def _evaluate(q: QuickstartRun, params) -> dict[str, Any]:
    return evaluate(q.base.config, params, q.base.params, q.tokenizer, q.heldout, q.run_config, q.stops)


def evaluate_base(q: QuickstartRun) -> None:
    """Held-out figures of the base policy (once)."""
    if "before" not in q.report:
        q.report["before"] = q.timed("evaluate_before", lambda: _evaluate(q, q.base.params))
        log.info("quickstart: base held-out pass@1 %.3f +- %.3f", q.report["before"]["pass@1"],
                 q.report["before"]["pass@1_se"])


def evaluate_start(q: QuickstartRun) -> None:
    """Held-out figures of the base (where ``q.base_evaluation`` computes them beside the first
    stages, its result) and, warm-started, of the SFT policy (once; before RL)."""
    from rlax_core.models import from_pretrained

    if q.base_evaluation is not None:
        q.base_evaluation.result()
    evaluate_base(q)
    if "sft" in q.report and "pass@1" not in q.report["sft"]:
        policy = from_pretrained(q.policy)
        q.report["sft"].update(q.timed("evaluate_sft", lambda: _evaluate(q, policy.params)))
        log.info("quickstart: after SFT held-out pass@1 %.3f +- %.3f", q.report["sft"]["pass@1"],
                 q.report["sft"]["pass@1_se"])


def keep_versions(q: QuickstartRun, folder: Path) -> list[str]:
    """Overrides that keep every weight version of a run (the curve scores them after training)."""
    steps = q.run_config.trainer.total_steps
    return [f"weights.root={folder}/weights", f"weights.run_id={q.run_config.run.name}", f"weights.keep={steps + 1}",
            "weights.gc_grace_s=100000"]


def rl_stage(q: QuickstartRun) -> None:
    from pipelines.launch import launch

    evaluate_start(q)
    if q.warm and q.compare_cold:  # the plain quickstart's RL, from the base model, beside the warm one
        cold = q.output / "run_cold"
        overrides = [*q.overrides, f"run.output_dir={cold}", *keep_versions(q, cold), *q.stage_overrides("rl")]
        q.report["cold"] = {"where": q.timed("rl_cold", lambda: launch(
            q.config_path, overrides, q.beam_args, train_set=str(q.train_set), timeout_s=q.timeout_s,
            resume=q.resumed)), "seconds": q.seconds["rl_cold"]}
    overrides = [*q.overrides, *q.stage_overrides("rl")]
    if q.warm:
        overrides += [f"model.path={q.policy}", *keep_versions(q, Path(q.run_config.run.output_dir))]
    q.where = q.timed("rl", lambda: launch(q.config_path, overrides, q.beam_args, train_set=str(q.train_set),
                                           timeout_s=q.timeout_s, resume=q.resumed))
    q.final_version, q.final_params = final_policy(q, overrides)


def final_policy(q: QuickstartRun, overrides: list[str], version: int | None = None):
    """(version, params) of the run ``overrides`` name: ``version``, or its newest."""
    import jax

    from pipelines.config import load_run_config
    from rlax_core.weights.adapters import load_version
    from rlax_core.weights.store import WeightStore

    store = WeightStore(load_run_config(q.config_path, overrides).weight_store())
    try:
        version = store.latest() if version is None else version
        # A LoRA run's versions are adapters: load_version merges them into their base version.
        return version, jax.tree.map(jax.numpy.asarray, load_version(store, version)[0])
    finally:
        store.close()


def evaluate_stage(q: QuickstartRun) -> None:
    from rlax_core.models import from_pretrained

    evaluate_start(q)
    params = q.final_params if q.final_params is not None else from_pretrained(q.policy).params
    q.report["after"] = q.timed("evaluate_after", lambda: _evaluate(q, params))
    if q.warm:
        q.timed("evaluate_curves", lambda: curves(q))


def curves(q: QuickstartRun) -> None:
    """Held-out pass@1 every ``curve_every`` RL steps of the warm run (and the cold one beside it),
    and the first evaluated step at or above the target."""
    runs = {"warm": (Path(q.run_config.run.output_dir), q.report["sft"])}
    if "cold" in q.report:
        runs["cold"] = (q.output / "run_cold", q.report["before"])
    steps = q.run_config.trainer.total_steps
    points = sorted({*range(q.curve_every, steps, q.curve_every), steps})
    for name, (folder, start) in runs.items():
        curve = [{"step": 0, "pass@1": start["pass@1"], "pass@1_se": start["pass@1_se"]}]
        for step in points:
            _, params = final_policy(q, [*q.overrides, f"run.output_dir={folder}", *keep_versions(q, folder)], step)
            scored = q.report["after"] if name == "warm" and step == steps else _evaluate(q, params)
            curve.append({"step": step, "pass@1": scored["pass@1"], "pass@1_se": scored["pass@1_se"]})
            log.info("quickstart: %s RL step %d: held-out pass@1 %.3f", name, step, curve[-1]["pass@1"])
        q.report.setdefault(name, {}).update(curve=curve, steps_to_target=steps_to_target(curve),
                                             final_pass_at_1=curve[-1]["pass@1"])


def steps_to_target(curve: list[dict]) -> int | None:
    """The first evaluated RL step (0: before any) whose held-out pass@1 is at or above the target."""
    return next((p["step"] for p in curve if p["pass@1"] >= TARGET_PASS_AT_1), None)


RUNNERS: dict[str, Callable[[QuickstartRun], None]] = {
    "curate": curate_stage, "rft": rft_stage, "rm": rm_stage, "sft": sft_stage, "filter": filter_stage, "rl": rl_stage,
    "evaluate": evaluate_stage,
}
