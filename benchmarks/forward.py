"""Forward throughput of the model core: tokens/s and model FLOPs utilisation (MFU).

For each model at batch x seq (default 16 x 256) it measures, in the same run:

  peak_matmul_flops   this machine's float32 matmul peak: a big jitted jnp matmul (the MFU baseline)
  tokens_per_s        the jitted full-sequence forward (float32 logits), best of --repeats
  mfu                 tokens_per_s * model FLOPs per token / peak_matmul_flops
  vs_transformers     (when torch + transformers are installed) our tokens/s over transformers'
                      eager torch forward on the very same weights, loaded from our save_pretrained

Models: "stories260K" (the real llama2.c checkpoint in pipelines/assets) and "25m", a random
Qwen2-shaped config (hidden 512, intermediate 1408, 8 layers, 8 heads, 4 KV heads, vocab 32000, tied).
Prints one JSON object.

    python benchmarks/forward.py
    python benchmarks/forward.py --models 25m --batch 8 --seq 128 --no-torch
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import baselines  # noqa: E402  (the baselines' fair settings)

from rlax_core.models import Model, ModelConfig, forward, from_pretrained, init_params, save_pretrained  # noqa: E402

QWEN2_25M = ModelConfig(
    architecture="qwen2", vocab_size=32000, hidden_size=512, intermediate_size=1408, num_layers=8, num_heads=8,
    num_kv_heads=4, head_dim=64, qkv_bias=True, tie_word_embeddings=True, rope_theta=1e6,
    max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=None, eos_token_ids=(2,))


def load(name: str) -> Model:
    if name == "stories260K":
        return from_pretrained(REPO / "pipelines/assets/stories260K")
    if name == "25m":
        return Model(QWEN2_25M, init_params(QWEN2_25M, jax.random.key(0)))
    raise SystemExit(f"unknown model {name!r}; choose stories260K or 25m")


def best_time(fn, repeats: int) -> float:
    fn()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def best_times_interleaved(fns, repeats: int, min_seconds: float = 0.0, max_repeats: int = 30) -> list[float]:
    """``best_time`` of each of ``fns``, their repeats taken in turn (a, b, a, b, ...): a drift in the
    machine's speed during the measurement then reaches every contender.

    At least ``repeats`` rounds, and more (up to ``max_repeats``) until every contender has run for
    ``min_seconds`` in all: a run of a fraction of a second gets as many chances at its best as
    one of several seconds gets from two, which matters on a machine whose speed moves by a third.
    """
    for fn in fns:
        fn()  # compile and warm up
    times = [[] for _ in fns]
    while len(times[0]) < max_repeats and (len(times[0]) < repeats or min(map(sum, times)) < min_seconds):
        for fn, measured in zip(fns, times):
            start = time.perf_counter()
            fn()
            measured.append(time.perf_counter() - start)
    return [min(measured) for measured in times]


def matmul_peak(n: int, repeats: int) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    return 2 * n**3 / best_time(lambda: matmul(a, b).block_until_ready(), repeats)


# The transformers baseline's from_pretrained keywords (float32, SDPA attention).
TRANSFORMERS_LOAD = baselines.TRANSFORMERS_LOAD_FAIR


def transformers_copy(model: Model, load: dict = TRANSFORMERS_LOAD):
    """The same weights in transformers (written by our save_pretrained, loaded back with ``load``),
    in eval mode; None where torch and transformers are not installed (the ``bench`` extra)."""
    try:
        import transformers
    except ImportError:
        return None
    baselines.setup_torch()
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        return transformers.AutoModelForCausalLM.from_pretrained(folder, **baselines.load_options(load)).eval()


def transformers_tokens_per_s(model: Model, ids: np.ndarray, repeats: int) -> float | None:
    reference = transformers_copy(model)
    if reference is None:
        return None
    import torch

    tokens = torch.from_numpy(ids.astype(np.int64))
    with torch.inference_mode():
        seconds = best_time(lambda: reference(tokens).logits, repeats)
    return ids.size / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="stories260K,25m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers (torch) comparison")
    args = parser.parse_args()

    peak = matmul_peak(args.matmul_size, args.repeats)
    results = {}
    run_forward = jax.jit(forward, static_argnames=("config", "remat"))
    for name in args.models.split(","):
        model = load(name)
        ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (args.batch, args.seq), dtype=np.int32)
        device_ids = jnp.asarray(ids)
        seconds = best_time(lambda: run_forward(model.params, model.config, device_ids).block_until_ready(),
                            args.repeats)
        tokens_per_s = ids.size / seconds
        flops_per_token = model.config.flops_per_token(args.seq)
        entry = {
            "params": model.config.num_params,
            "params_outside_embedding": model.config.num_params - model.config.vocab_size * model.config.hidden_size,
            "flops_per_token": flops_per_token,
            "forward_s": round(seconds, 4),
            "tokens_per_s": round(tokens_per_s, 1),
            "mfu": round(tokens_per_s * flops_per_token / peak, 4),
        }
        if not args.no_torch:
            reference = transformers_tokens_per_s(model, ids, args.repeats)
            if reference is not None:
                entry["transformers_tokens_per_s"] = round(reference, 1)
                entry["vs_transformers"] = round(tokens_per_s / reference, 3)
        results[name] = entry

    print(json.dumps({
        "benchmark": "forward", "backend": jax.default_backend(), "devices": jax.device_count(),
        "batch": args.batch, "seq": args.seq, "dtype": baselines.OUR_DTYPE,
        "transformers_settings": None if args.no_torch else baselines.transformers_settings(TRANSFORMERS_LOAD),
        "peak_matmul_flops": round(peak), "matmul_size": args.matmul_size, "models": results,
    }, indent=2))


if __name__ == "__main__":
    main()
