"""The device check: what one accelerator does with a ~0.5B model, measured beside what XLA compiled.

    python benchmarks/device_check.py --out "$OUT/device_check.json"   # one GPU or TPU chip: < 8 minutes
    python benchmarks/device_check.py --dry-run                          # CPU, a tiny model: seconds

Written for a machine that holds JAX (0.10.2 or 0.11.2, with its CUDA or TPU plugin), flax, optax,
orbax and this working tree, nothing else: random weights of Qwen2.5-0.5B-Instruct's shape
(``PUBLISHED_CONFIGS``), bfloat16. Prints one JSON object (and writes it to ``--out``):

  device, chip, peaks   the device JAX sees, the chip it is (``chip_of_device_kind``; ``--chip`` to
                        name it) and the chip's published dense bfloat16 FLOP/s and HBM bandwidth
  bandwidth_gb_per_s    a device-side copy, best of repeats (read + write counted)
  kernel                the GPU paged-attention kernel against the jnp reference (GPU only; exit 1
                        beyond 2e-2): gpu_decode.py's check
  decode[]              per number of sequences (1, 64, 256): the Engine decoding --new-tokens greedy
                        tokens each after a --prompt-len prompt, bfloat16 weights and pages.
                        tokens_per_s counts the decode calls after the first (which holds the
                        prefills), best of --repeats; bytes_per_step is the weights plus the KV pages
                        the sequences' cached tokens fill (K and V, every layer) at the mean context;
                        roofline_tokens_per_s = sequences x HBM bandwidth / bytes_per_step (published
                        bandwidth on a known chip, else the measured copy's), of_roofline the share;
                        compiled: XLA's report of the decode program ``rlax compile`` builds for that
                        engine, and xla_tokens_per_s = sequences / its roofline time for one step
  prefill               the engine's prefill program (as ``rlax compile`` builds it) run on a batch of
                        --prefill-batch prompts of --prefill-len tokens: seconds, model FLOPs (the
                        forward without the classifier, which prefill drops) and MFU against the
                        chip's published peak; compiled: XLA's report of that program
  update_step           the trainer's update (GRPO, remat, --micro-batches) on --rows rows of
                        --seq-len tokens: seconds, model FLOPs (3 x the forward's, the convention: the
                        scoring pass and remat's recompute are not counted) and MFU; compiled: XLA's
                        report of the program ``rlax compile`` builds for it
  seconds               the check's wall time; phases left out past --budget-s are named in skipped

XLA's figures are its compile-time estimates (docs/compile.md): bytes from its buffer assignment,
FLOPs and bytes accessed from its cost analysis with a loop body counted once (decode: one step;
the update: one micro-batch), cuDNN and Triton calls counted as no FLOPs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_decode  # noqa: E402  (the copy bandwidth, the paged-attention kernel check, best_seconds)
from rlax_core.compile.programs import Program, engine_programs  # noqa: E402
from rlax_core.compile.report import ProgramReport, report_compiled  # noqa: E402
from rlax_core.inference.config import EngineConfig, SamplingParams  # noqa: E402
from rlax_core.inference.engine import Engine, Request  # noqa: E402
from rlax_core.inference.kv_cache import init_kv_cache  # noqa: E402
from rlax_core.inference.programs import decoding_layout  # noqa: E402
from rlax_core.inference.sampling import SamplingMode  # noqa: E402
from rlax_core.models.config import PUBLISHED_CONFIGS, ModelConfig, toy_config  # noqa: E402
from rlax_core.models.transformer import init_params  # noqa: E402
from rlax_core.parallel.config import MeshConfig  # noqa: E402
from rlax_core.parallel.mesh import make_mesh  # noqa: E402
from rlax_core.planning.hardware import CHIP_PEAKS, chip_of_device_kind  # noqa: E402
from rlax_core.rl.presets import get_preset  # noqa: E402
from rlax_core.training.config import TrainerConfig  # noqa: E402
from rlax_core.training.step import Trainer  # noqa: E402

MODEL = "Qwen2.5-0.5B-Instruct"


@dataclasses.dataclass(frozen=True)
class Sizes:
    sequences: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    page_size: int
    prefill_batch: int
    prefill_len: int
    rows: int
    seq_len: int
    micro_batches: int
    repeats: int


FULL = Sizes(sequences=(1, 64, 256), prompt_len=512, new_tokens=256, page_size=64, prefill_batch=16,
             prefill_len=1024, rows=64, seq_len=1024, micro_batches=4, repeats=3)
# One page per sequence: the CPU engine's dense decode window then compiles for one width only.
DRY = Sizes(sequences=(2,), prompt_len=8, new_tokens=32, page_size=64, prefill_batch=2, prefill_len=64,
            rows=4, seq_len=32, micro_batches=2, repeats=1)


class Clock:
    """The check's phases against its budget: progress on stderr, phases past the budget left out."""

    def __init__(self, budget_s: float):
        self.started, self.budget_s, self.skipped = time.monotonic(), budget_s, []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, phase: str) -> None:
        print(f"device_check: {phase} ({self.elapsed():.0f} s)", file=sys.stderr, flush=True)

    def start(self, phase: str) -> bool:
        """Whether ``phase`` runs: it does while the check is within its budget."""
        if self.elapsed() > self.budget_s:
            self.skipped.append(phase)
            print(f"device_check: {phase}: skipped, {self.elapsed():.0f} s is past the {self.budget_s:.0f} s budget",
                  file=sys.stderr, flush=True)
            return False
        self.note(phase)
        return True


def compiled_report(program: Program, chip: str | None, topology: str) -> tuple[ProgramReport, object]:
    """Compile ``program`` once: XLA's report of it and the executable (to run what was reported)."""
    started = time.monotonic()
    compiled = program.lower().compile()
    return report_compiled(program, chip or "unknown", topology, compiled, time.monotonic() - started), compiled


def _compiled_json(report: ProgramReport) -> dict:
    return {"peak_bytes": report.peak_bytes, "argument_bytes": report.argument_bytes, "temp_bytes": report.temp_bytes,
            "flops": report.flops, "bytes_accessed": report.bytes_accessed, "roofline_s": report.roofline_s,
            "optimal_s": report.optimal_s, "kernels": list(report.kernels), "compile_s": round(report.compile_s, 2)}


def kv_bytes_per_token(model: ModelConfig) -> int:
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2  # K and V, bfloat16


def engine_config(sequences: int, sizes: Sizes) -> EngineConfig:
    pages = -(-(sizes.prompt_len + sizes.new_tokens) // sizes.page_size)
    return EngineConfig(num_slots=sequences, page_size=sizes.page_size, num_pages=sequences * pages + 1,
                        max_prompt_len=sizes.prompt_len, max_new_tokens=sizes.new_tokens,
                        prefill_buckets=(sizes.prompt_len,), max_prefill_batch=min(sequences, 16),
                        decode_steps_per_call=16, attention_impl="auto", cache_dtype="bfloat16")


def decode(model: ModelConfig, params, sequences: int, sizes: Sizes, device, chip: str | None,
           bandwidth: float) -> dict:
    """The Engine's decode tokens/s at ``sequences`` sequences, against the HBM roofline and XLA's estimate."""
    config = engine_config(sequences, sizes)
    (program,) = [p for p in engine_programs(model, config, "bfloat16", [device], SamplingMode.GREEDY)
                  if p.name.startswith("decode")]
    report, _ = compiled_report(program, chip, "1 device")
    engine = Engine(config, model, params, device=device)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=sizes.new_tokens, ignore_eos=True)
    rng = np.random.default_rng(sequences)
    best, chunk = 0.0, config.decode_steps_per_call
    for round_ in range(1 + sizes.repeats):  # round 0, untimed, compiles what the rounds run
        for i in range(sequences):
            engine.add_request(Request(rng.integers(3, model.vocab_size, sizes.prompt_len).tolist(), sampling,
                                       prompt_id=i))
        engine.step()  # admits and prefills every sequence, and decodes their first chunk
        tokens, start = engine.stats["tokens"], time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        if round_:
            best = max(best, (engine.stats["tokens"] - tokens) / (time.perf_counter() - start))
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    # The measured calls decode from prompt + one chunk to prompt + new tokens: the mean context, in whole pages.
    context = sizes.prompt_len + chunk + (sizes.new_tokens - chunk) / 2
    pages = -(-context // sizes.page_size)
    step_bytes = weights + sequences * pages * sizes.page_size * kv_bytes_per_token(model)
    peak_bandwidth = CHIP_PEAKS[chip].hbm_bytes_per_s if chip in CHIP_PEAKS else bandwidth
    roofline = sequences * peak_bandwidth / step_bytes
    compiled = _compiled_json(report)
    compiled["xla_tokens_per_s"] = sequences / report.roofline_s if report.roofline_s else None
    return {"sequences": sequences, "prompt_len": sizes.prompt_len, "new_tokens": sizes.new_tokens,
            "tokens_per_s": best, "bytes_per_step": step_bytes, "roofline_tokens_per_s": roofline,
            "of_roofline": best / roofline, "compiled": compiled}


def prefill_flops(model: ModelConfig, batch: int, length: int) -> float:
    """Model FLOPs of a prefill: the forward of every prompt token, the classifier dropped."""
    return batch * length * (model.flops_per_token(length) - 2.0 * model.vocab_size * model.hidden_size)


def prefill(model: ModelConfig, params, sizes: Sizes, device, chip: str | None) -> dict:
    """The engine's prefill program, as ``rlax compile`` compiles it, run on ``prefill_batch`` prompts."""
    batch, length, page_size = sizes.prefill_batch, sizes.prefill_len, sizes.page_size
    pages = length // page_size
    config = EngineConfig(num_slots=batch, page_size=page_size, num_pages=batch * pages + 1, max_prompt_len=length,
                          max_new_tokens=page_size, prefill_buckets=(length,), max_prefill_batch=batch,
                          attention_impl="auto", cache_dtype="bfloat16")
    (program,) = [p for p in engine_programs(model, config, "bfloat16", [device], SamplingMode.GREEDY)
                  if p.name.startswith("prefill")]
    report, compiled = compiled_report(program, chip, "1 device")
    rng = np.random.default_rng(0)
    with jax.default_device(device):
        weights = decoding_layout(params)
        cache = init_kv_cache(model.num_layers, config.num_pages, page_size, model.num_kv_heads, model.head_dim,
                              jnp.bfloat16)
    tokens = jax.device_put(rng.integers(3, model.vocab_size, (batch, length)).astype(np.int32), device)
    positions = jax.device_put(np.tile(np.arange(length, dtype=np.int32), (batch, 1)), device)
    table = np.zeros((batch, config.pages_per_sequence), np.int32)
    table[:, :pages] = 1 + np.arange(batch * pages, dtype=np.int32).reshape(batch, pages)
    table = jax.device_put(table, device)
    # The cache is donated: carried along (the routed ids beside it are a mixture of experts' only).
    holder = {"cache": compiled(weights, cache, tokens, positions, table)[0]}

    def run():
        holder["cache"] = compiled(weights, holder["cache"], tokens, positions, table)[0]
        jax.block_until_ready(holder["cache"])

    seconds = gpu_decode.best_seconds(run, max(sizes.repeats, 3))
    flops = prefill_flops(model, batch, length)
    peak = CHIP_PEAKS[chip].bf16_flops if chip in CHIP_PEAKS else None
    return {"batch": batch, "prompt_len": length, "seconds": seconds, "tokens_per_s": batch * length / seconds,
            "model_flops": flops, "mfu": flops / seconds / peak if peak else None, "compiled": _compiled_json(report)}


def update_step(model: ModelConfig, params, sizes: Sizes, device, chip: str | None) -> dict:
    """The trainer's update on ``rows`` rows of ``seq_len`` tokens, compiled once and timed."""
    config = TrainerConfig(param_dtype="bfloat16", max_seq_len=sizes.seq_len, micro_batches=sizes.micro_batches,
                           remat=True, mesh=MeshConfig(data=1, fsdp=1, tensor=1))
    trainer = Trainer(model, dataclasses.replace(get_preset("grpo"), kl_coef=0.0), config,
                      make_mesh(config.mesh, [device]))
    state = trainer.init_state(params)
    lowered = trainer.lower_step(state, sizes.rows)
    report, _ = compiled_report(Program("trainer", "update step", lambda: lowered), chip, "1 device")
    rows, length, prompt = sizes.rows, sizes.seq_len, sizes.seq_len // 4
    rng = np.random.default_rng(0)
    batch = trainer.put_batch({
        "tokens": rng.integers(3, model.vocab_size, (rows, length)).astype(np.int32),
        "attention_mask": np.ones((rows, length), np.int32),
        "loss_mask": (np.arange(length - 1)[None] >= prompt - 1).repeat(rows, 0).astype(np.float32),
        "behavior_logprobs": np.full((rows, length - 1), -2.0, np.float32),
        "rewards": rng.random(rows).astype(np.float32),
        "group_ids": np.repeat(np.arange(rows // 4), 4).astype(np.int32),
        "sample_mask": np.ones(rows, np.float32),
        "policy_versions": np.zeros(rows, np.int32),
    })
    holder = {"state": state}

    def run():
        holder["state"], metrics = trainer.step(holder["state"], batch)
        jax.block_until_ready(metrics)

    seconds = gpu_decode.best_seconds(run, sizes.repeats)
    flops = 3 * model.flops_per_token(length) * rows * length
    peak = CHIP_PEAKS[chip].bf16_flops if chip in CHIP_PEAKS else None
    return {"rows": rows, "seq_len": length, "micro_batches": sizes.micro_batches, "seconds": seconds,
            "tokens_per_s": rows * length / seconds, "model_flops": flops,
            "mfu": flops / seconds / peak if peak else None, "compiled": _compiled_json(report)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, a tiny model and tiny sizes: that it runs")
    parser.add_argument("--chip", default=None, help="the chip's name in CHIP_PEAKS when the device kind is not known")
    parser.add_argument("--sequences", type=int, nargs="+", default=None, help="decode batches (default 1 64 256)")
    parser.add_argument("--budget-s", type=float, default=360.0, help="phases that would start later are left out")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    if args.sequences:
        sizes = dataclasses.replace(sizes, sequences=tuple(args.sequences))
    device = jax.devices()[0]
    if not args.dry_run and device.platform == "cpu":
        parser.exit(2, "device_check: no accelerator here (JAX sees only the CPU); --dry-run checks the script\n")
    chip = args.chip or chip_of_device_kind(device.device_kind)
    if args.chip and args.chip not in CHIP_PEAKS:
        parser.exit(2, f"device_check: --chip {args.chip!r} is not one of {', '.join(CHIP_PEAKS)}\n")
    clock = Clock(args.budget_s)
    model = toy_config(vocab_size=512, max_position_embeddings=256) if args.dry_run else PUBLISHED_CONFIGS[MODEL]
    with jax.default_device(device):
        params = init_params(model, jax.random.key(0), jnp.bfloat16)
    report = {"device": device.device_kind, "platform": device.platform, "jax": jax.__version__,
              "dry_run": args.dry_run, "model": "toy" if args.dry_run else MODEL, "params": model.num_params,
              "chip": chip, "peaks": dataclasses.asdict(CHIP_PEAKS[chip]) if chip in CHIP_PEAKS else None,
              "sizes": dataclasses.asdict(sizes)}
    clock.note("bandwidth")  # always measured: the roofline's bandwidth where the chip's is not published
    bandwidth = gpu_decode.measure_bandwidth(2**20 if args.dry_run else 2**30, max(sizes.repeats, 3))
    report["bandwidth_gb_per_s"] = bandwidth / 1e9
    if device.platform == "gpu" and clock.start("paged-attention kernel against the reference"):
        report["kernel"] = gpu_decode.check_and_time_kernel(model, batch=64, context=4096, page_size=sizes.page_size,
                                                            interpret=False, repeats=sizes.repeats)
    report["decode"] = [decode(model, params, n, sizes, device, chip, bandwidth) for n in sizes.sequences
                        if clock.start(f"decode, {n} sequence(s)")]
    if clock.start("prefill"):
        report["prefill"] = prefill(model, params, sizes, device, chip)
    if clock.start("update step"):
        report["update_step"] = update_step(model, params, sizes, device, chip)
    report["skipped"], report["seconds"] = clock.skipped, clock.elapsed()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    kernel = report.get("kernel")
    if kernel is not None and not kernel["matches_reference"]:
        parser.exit(1, f"device_check: the paged-attention kernel differs from the reference by "
                       f"{kernel['max_abs_error']:.3g}\n")
    if clock.skipped:
        parser.exit(1, f"device_check: past the budget, not measured: {', '.join(clock.skipped)}\n")
    return json.loads(text)  # what was printed


if __name__ == "__main__":
    main()
