"""``rlax launch --config RECIPE --rehearse``: a production recipe end to end on this machine, before spending money.

    rlax launch --config configs/qwen25_7b_math_dataflow_tpu.yaml --rehearse --output runs/rehearse-math

checks the recipe as written against its ``hardware:`` section (``rlax plan``; a recipe that would not
fit fails here), then runs its four stages in order, as the recipe wires them (curate -> filter -> the
trainer and the rollout stream together -> evaluate), each by its own function, with the same config
file and one fixed set of overrides (:func:`rehearsal_overrides`), nothing else changed:

* the model: a tiny random model of the same architecture (the recipe model's ``config.json`` when
  it is on this machine, else Qwen2's, the family of the recipes' models) over the real tokenizer
  (``--tokenizer``, default the Qwen2 tokenizer of ``tests/fixtures``), so prompts are the real
  prompts, token for token;
* the data: a few rows (``--rows``) of the same datasets (``--data``, default ``tests/fixtures/data`` of a
  checkout; an installed rlax has none, and the rehearsal names the files it needs):
  each input of the recipe is matched to the fixture folder of its dataset (``.../gsm8k/train.jsonl``
  -> ``gsm8k/``); training inputs take the first rows, evaluation sets the rows after them, so
  decontamination has real work and removes nothing by accident;
* the runners: local (DirectRunner for the batch jobs, Prism for the stream) instead of Dataflow;
  shapes small enough for a laptop (engine slots and pages, 2 trainer steps of 2 groups);
* the outputs: curated and filtered data, evaluation reports and plots and every metric under
  ``--output`` (a local folder or ``gs://``); the run's working state (checkpoints, weights,
  rollouts) in a local folder beside it.

What stays is what a rehearsal is for: the recipe's task rewards (math verifier, code sandbox), its
algorithm, prompt formats, loop wiring and the paths between the stages.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable, Sequence

from rlax_core.config import ConfigError
from rlax_core.utils.paths import is_remote, join

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "tests" / "fixtures" / "data"
DEFAULT_TOKENIZER = DEFAULT_DATA / "tokenizers" / "qwen2"
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json",
                   "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")
MAX_PROMPT = 512
NEW_TOKENS = 16
ENGINE = (f"{{num_slots: 8, page_size: 16, num_pages: 300, max_prompt_len: {MAX_PROMPT}, "
          f"max_new_tokens: {NEW_TOKENS}, prefill_buckets: [{MAX_PROMPT}], attention_impl: reference, "
          "cache_dtype: float32, replicas: 1}")


def tiny_model(recipe_model: str, tokenizer_dir: Path, folder: Path) -> Path:
    """A random 2-layer model of the recipe model's architecture over the real tokenizer's vocabulary."""
    import jax

    from rlax_core.models import Model, init_params, load_tokenizer, save_pretrained, toy_config

    architecture = "qwen2"
    config_file = Path(recipe_model) / "config.json"
    if not is_remote(recipe_model) and config_file.exists():
        architecture = json.loads(config_file.read_text()).get("model_type", architecture)
    else:  # a bucket: a rehearsal reaches no cloud, so it cannot read it
        log.info("rehearse: %s is not on this machine; a tiny model of the %s architecture", recipe_model, architecture)
    tokenizer = load_tokenizer(tokenizer_dir)
    eos = tuple(i for i in (tokenizer.token_to_id("<|im_end|>"), tokenizer.eos_id) if i is not None)
    config = toy_config(architecture=architecture, vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.bos_id,
                        eos_token_ids=tuple(dict.fromkeys(eos)), pad_token_id=tokenizer.pad_id or eos[-1],
                        max_position_embeddings=MAX_PROMPT + NEW_TOKENS)
    save_pretrained(Model(config, init_params(config, jax.random.key(0))), folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def _dataset_file(path: str, data: Path) -> Path:
    """The fixture file of the dataset a recipe path names (its folder: ``.../gsm8k/train.jsonl`` -> ``gsm8k``)."""
    name = path.rstrip("/").split("/")[-2]
    files = sorted((data / name).glob("*.jsonl")) if (data / name).is_dir() else []
    if not files:
        raise ConfigError("--data", f"no rehearsal rows for {path}: {data / name}/ holds no .jsonl file")
    return files[0]


def _copy_rows(source: Path, target: str, first: int, count: int) -> str:
    import fsspec

    lines = [line for line in source.read_text(encoding="utf-8-sig").splitlines() if line.strip()][first:first + count]
    if not lines:
        raise ConfigError("--rows", f"{source} has no rows {first}..{first + count}")
    with fsspec.open(target, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return target


def rehearsal_overrides(run_config, *, output: str, state: Path, model: Path, data: Path, rows: int) -> list[str]:
    """The one set of overrides that turns a production recipe into its rehearsal (module docstring)."""

    def inputs(specs, first: int, folder: str) -> str:
        copied = []
        for i, spec in enumerate(specs):
            target = join(output, "data", folder, f"{i}-{Path(spec.path).name.replace('*', 'x')}")
            if not target.endswith(".jsonl"):
                target += ".jsonl"
            _copy_rows(_dataset_file(spec.path, data), target, first, rows)
            copied.append(f"{{path: {target}, format: {spec.format}}}")
        return "[" + ", ".join(copied) + "]"

    curate, evaluate = run_config.curate, run_config.evaluate
    generation = (f"{{model: {model}, dtype: float32, sampling: {{samples_per_prompt: 2, temperature: 1.0, "
                  f"max_new_tokens: {NEW_TOKENS}}}, batch_size: 4, engine: {ENGINE}}}")
    # A recipe's overlong shaping, rescaled to the rehearsal's budget: the stream still applies it.
    shaping = ([f"algorithm.overlong_max_length={NEW_TOKENS}", f"algorithm.overlong_cache_length={NEW_TOKENS // 2}"]
               if run_config.algorithm.overlong_max_length else [])
    return [*shaping,
        f"run.output_dir={state / 'run'}", f"run.metrics_dir={join(output, 'metrics')}",
        f"model.path={model}", "model.dtype=float32", f"weights.root={state / 'run' / 'weights'}",
        f"engine={ENGINE}",
        "trainer.param_dtype=float32", "trainer.groups_per_step=2", "trainer.micro_batches=1", "trainer.remat=false",
        f"trainer.max_seq_len={MAX_PROMPT + NEW_TOKENS}", "trainer.total_steps=2", "trainer.checkpoint_every=1",
        "trainer.wait_timeout_s=600", "trainer.mesh={data: 1, fsdp: -1, tensor: 1, distributed: false}",
        "trainer.optimizer.warmup_steps=0", "trainer.optimizer.decay_steps=2",
        f"curate.inputs={inputs(curate.inputs, 0, 'train')}",
        f"curate.decontaminate_against={inputs(curate.decontaminate_against, rows, 'eval')}",
        f"curate.output={join(output, 'curated')}", "curate.num_shards=1",
        f"filter.input={join(output, 'curated', 'examples-*.parquet')}", f"filter.output={join(output, 'filtered')}",
        f"filter.generation={generation}", "filter.low=0.0", "filter.high=1.0",  # a random model passes nothing
        f"loop.train_set={join(output, 'filtered', 'examples-*.parquet')}", "loop.sampling.samples_per_prompt=2",
        "loop.poll_interval_s=1.0",
        "loop.max_runtime_s=900", "loop.startup_budget_s=600", "loop.rewards.code.workers=1",
        "algorithm.dynamic_sampling=false",  # a random model's groups are all uniform: none would reach the trainer
        f"evaluate.models=[{model}]", f"evaluate.eval_sets={inputs(evaluate.eval_sets, rows, 'evaluate')}",
        f"evaluate.output={join(output, 'eval')}", f"evaluate.generation={generation}", "evaluate.ks=[1, 2]",
        "evaluate.limit=0",
        "beam={runner: '', options: {}, curate: {}, filter: {}, evaluate: {}, rollout: {}}",
    ]


def rehearse(config: str, output: str, run_loop: Callable[..., dict], *, user_overrides: Sequence[str] = (),
             data: Path = DEFAULT_DATA, tokenizer: Path = DEFAULT_TOKENIZER, rows: int = 6,
             timeout_s: float = 1200.0) -> dict[str, str]:
    """Run the recipe's stages in order on this machine; returns where their outputs are.

    First, ``rlax plan``'s check of the recipe as written (with ``user_overrides``, the command
    line's) against its ``hardware:`` section: a recipe that would not fit its chips fails here,
    before the rehearsal's tiny model and shapes hide it. Each
    stage is its own function (the batch commands' ``COMMAND.execute``, and ``run_loop``: the
    caller's ``pipelines.launch.launch``), on the recipe's config with the rehearsal's overrides.
    """
    from pipelines import curate, evaluate, filter_difficulty
    from pipelines.config import load_run_config
    from pipelines.plan import check_memory

    if not config:
        raise ConfigError("--config", "--rehearse rehearses a recipe: give --config RECIPE")
    run_config = load_run_config(config, user_overrides)
    check_memory(run_config)
    require_rehearsal_files(run_config, Path(data), Path(tokenizer))
    name = run_config.run.name
    if not is_remote(output):
        output = str(Path(output).resolve())
    # Absolute: the trainer and the rollout job run from the repository root.
    state = ((Path("runs") / "rehearse" / name if is_remote(output) else Path(output)) / "state").resolve()
    if state.exists():
        shutil.rmtree(state)  # a rehearsal starts from nothing, as the production run would
    state.mkdir(parents=True)
    model = tiny_model(run_config.model.path, Path(tokenizer), state / "tiny_model")
    overrides = [*user_overrides,  # the rehearsal's own come last: they win where both set a key
                 *rehearsal_overrides(run_config, output=output, state=state, model=model, data=Path(data), rows=rows)]
    rehearsed = load_run_config(config, overrides)
    for stage, command, section in (("curate", curate.COMMAND, rehearsed.curate),
                                    ("filter", filter_difficulty.COMMAND, rehearsed.filter)):
        log.info("rehearse %s: %s", name, stage)
        if command.execute(section, rehearsed.beam.args(stage)) != 0:
            raise RuntimeError(f"rehearsal of {config}: rlax {stage} failed")
    log.info("rehearse %s: launch (trainer + rollout stream)", name)
    run_loop(config, overrides, [], timeout_s=timeout_s)
    log.info("rehearse %s: evaluate", name)
    if evaluate.COMMAND.execute(rehearsed.evaluate, rehearsed.beam.args("evaluate")) != 0:
        raise RuntimeError(f"rehearsal of {config}: rlax evaluate failed")
    return {"curated": join(output, "curated"), "filtered": join(output, "filtered"),
            "metrics": join(output, "metrics"), "evaluation": join(output, "eval"), "run state": str(state)}


def require_rehearsal_files(run_config, data: Path, tokenizer: Path) -> None:
    """The rows and the tokenizer the rehearsal reads, named in one line when they are not here (an
    installed rlax has no tests/fixtures: give --data and --tokenizer)."""
    inputs = [*run_config.curate.inputs, *run_config.curate.decontaminate_against, *run_config.evaluate.eval_sets]
    needed = sorted({spec.path.rstrip("/").split("/")[-2] for spec in inputs})
    missing = [f"{data / folder}/*.jsonl" for folder in needed if not sorted((data / folder).glob("*.jsonl"))]
    if missing:
        raise ConfigError("--data", f"the rehearsal reads a few rows of each dataset of the recipe: "
                                    f"{', '.join(missing)} (a checkout has them in tests/fixtures/data; give --data FOLDER)")
    if not any((tokenizer / name).exists() for name in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        raise ConfigError("--tokenizer", f"{tokenizer} holds no tokenizer (tokenizer.json, vocab.json + merges.txt or "
                                         "tokenizer.model): give the recipe model's tokenizer folder")


def add_arguments(parser) -> None:
    parser.add_argument("--rehearse", action="store_true",
                        help="run the recipe end to end here: tiny random model, real tokenizer, a few real rows, "
                             "local runners (pipelines/rehearse.py)")
    parser.add_argument("--rows", type=int, default=6, help="with --rehearse: rows per dataset")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="with --rehearse: folder of dataset folders")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="with --rehearse: the real tokenizer")


def run_from_args(args, beam_args: Sequence[str], run_loop: Callable[..., dict]) -> int:
    """``rlax launch --rehearse``: ``run_loop`` is the launch's own function that runs the loop stage."""
    from rlax_core.config import require

    if beam_args:
        raise ConfigError("", f"a rehearsal runs locally; it takes no Beam options: {' '.join(beam_args)}")
    require(args.rows >= 1, "--rows", f"rows per dataset >= 1, got {args.rows}")
    output = args.output or f"runs/rehearse/{Path(args.config or 'recipe').stem}"
    where = rehearse(args.config, output, run_loop, user_overrides=args.overrides, data=Path(args.data),
                     tokenizer=Path(args.tokenizer), rows=args.rows, timeout_s=args.timeout_s)
    print("rlax launch --rehearse: every stage passed.")
    width = max(map(len, where))
    for key, path in where.items():
        print(f"  {key:<{width}}  {path}")
    return 0
