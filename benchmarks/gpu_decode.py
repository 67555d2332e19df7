"""Decode on a GPU: JAX's Pallas paged-attention kernel checked and timed, and the engine's decode
tokens/s against the memory-bandwidth bound. A prepared script for a machine with a GPU (under 10
minutes on one); ``--dry-run`` runs the same path small on CPU, the kernel interpreted.

Measures in one run and prints one JSON object:

  kernel.max_abs_error        (exit 1 above 2e-2) the GPU kernel (``rlax_core.inference.pallas_attention``, kernel="gpu")
                              against the jnp reference on ragged lengths and GQA, bfloat16 cache
  kernel.seconds / kernel.gb_per_s   one layer's paged attention over the batch's cached tokens,
                              best of repeats; of_bandwidth is its share of the measured bandwidth
  bandwidth_gb_per_s          this device's memory bandwidth: best time of copying a 1 GiB array
                              (read + write counted)
  engine[batch].tokens_per_s  the Engine (attention_impl "pallas", bfloat16 weights and cache,
                              compiled beforehand by warm_up) decoding --new-tokens forced tokens
                              per sequence after --prompt-len tokens, best of --repeats
  engine[batch].bound_tokens_per_s   bandwidth / bytes read per decode step (all weights + every
                              sequence's cached tokens at the mean length), times the batch;
                              of_bound is the engine's share

Model: a random Qwen2.5-1.5B-shaped config (28 layers, 12 query / 2 KV heads of 128, hidden 1536,
vocab 151936: 3.1 GB in bfloat16), or --model tiny (the dry run's).

    python benchmarks/gpu_decode.py                       # on a GPU machine
    python benchmarks/gpu_decode.py --dry-run             # CPU, interpreted, small: that it runs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlax_core.inference.attention import paged_decode_attention_reference  # noqa: E402
from rlax_core.inference.config import EngineConfig, SamplingParams  # noqa: E402
from rlax_core.inference.engine import Engine, Request  # noqa: E402
from rlax_core.inference.pallas_attention import paged_decode_attention  # noqa: E402
from rlax_core.inference.sampling import SamplingMode  # noqa: E402
from rlax_core.models.config import PUBLISHED_CONFIGS, ModelConfig  # noqa: E402
from rlax_core.models.transformer import init_params  # noqa: E402

TINY = ModelConfig(architecture="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, eos_token_ids=(2,))
KERNEL_TOLERANCE = 2e-2
MODELS = {"qwen2.5-1.5b": PUBLISHED_CONFIGS["Qwen2.5-1.5B-Instruct"], "tiny": TINY}


def best_seconds(run, repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``run``, after one that compiles and warms the caches."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(size_bytes: int, repeats: int) -> float:
    """Bytes per second of a device-side copy (one read and one write of every byte)."""
    x = jnp.ones((size_bytes // 4,), jnp.float32)
    copy = jax.jit(lambda a: a + 1.0)
    seconds = best_seconds(lambda: copy(x).block_until_ready(), repeats)
    return 2 * size_bytes / seconds


def check_and_time_kernel(model: ModelConfig, batch: int, context: int, page_size: int, interpret: bool,
                          repeats: int) -> dict:
    """One layer's decode attention: the kernel against the reference, then timed alone."""
    rng = np.random.default_rng(0)
    pages_per_sequence = -(-context // page_size)
    num_pages = batch * pages_per_sequence + 1
    heads, kv_heads, dim = model.num_heads, model.num_kv_heads, model.head_dim
    q = jnp.asarray(rng.normal(size=(batch, heads, dim)), jnp.bfloat16)
    k = jnp.asarray(rng.normal(size=(kv_heads, num_pages, page_size, dim)), jnp.bfloat16)
    v = jnp.asarray(rng.normal(size=(kv_heads, num_pages, page_size, dim)), jnp.bfloat16)
    table = jnp.asarray(rng.permutation(np.arange(1, num_pages)).reshape(batch, pages_per_sequence), jnp.int32)
    # Ragged: from one token to the full context.
    lengths = jnp.asarray(np.linspace(1, context, batch).astype(np.int32))
    scale = dim ** -0.5
    attend = jax.jit(lambda *xs: paged_decode_attention(*xs, scale=scale, kernel="gpu", interpret=interpret))
    out = attend(q, k, v, table, lengths)
    reference = paged_decode_attention_reference(q.astype(jnp.float32), k.astype(jnp.float32),
                                                 v.astype(jnp.float32), table, lengths, scale)
    error = float(jnp.max(jnp.abs(out.astype(jnp.float32) - reference)))
    # The kernel returns q's dtype: bfloat16 rounding of outputs of size ~1 is ~4e-3.
    seconds = best_seconds(lambda: attend(q, k, v, table, lengths).block_until_ready(), repeats)
    read = 2 * int(jnp.sum(lengths)) * kv_heads * dim * 2  # K and V of every cached token, bfloat16
    return {"batch": batch, "context": context, "page_size": page_size, "max_abs_error": error,
            "matches_reference": error <= KERNEL_TOLERANCE,
            "seconds": seconds, "gb_per_s": read / seconds / 1e9}


def engine_decode(model: ModelConfig, batch: int, prompt_len: int, new_tokens: int, page_size: int,
                  repeats: int) -> dict:
    params = init_params(model, jax.random.key(0), dtype=jnp.bfloat16)
    pages = batch * -(-(prompt_len + new_tokens) // page_size) + 1
    config = EngineConfig(num_slots=batch, page_size=page_size, num_pages=pages, max_prompt_len=prompt_len,
                          max_new_tokens=new_tokens, prefill_buckets=(prompt_len,), decode_steps_per_call=16,
                          attention_impl="pallas", cache_dtype="bfloat16")
    engine = Engine(config, model, params)
    engine.warm_up(modes=(SamplingMode.GREEDY,))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    rng = np.random.default_rng(1)
    requests = [Request(rng.integers(3, model.vocab_size, prompt_len).tolist(), sampling, prompt_id=i)
                for i in range(batch)]
    seconds = best_seconds(lambda: engine.generate(requests), repeats)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    step_bytes = weight_bytes + batch * (prompt_len + new_tokens / 2) * kv_per_token
    return {"batch": batch, "tokens_per_s": batch * new_tokens / seconds, "seconds": seconds,
            "bytes_per_step": step_bytes}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, kernel interpreted, tiny sizes")
    parser.add_argument("--model", choices=sorted(MODELS), default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--context", type=int, default=None, help="longest sequence of the kernel check")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    dry = args.dry_run
    platform = jax.default_backend()
    if not dry and platform != "gpu":
        parser.exit(2, f"gpu_decode: no GPU here (JAX backend {platform!r}); use --dry-run to check the script on CPU\n")
    model = MODELS[args.model or ("tiny" if dry else "qwen2.5-1.5b")]
    batches = args.batches or ([2] if dry else [1, 16, 64])
    prompt_len = args.prompt_len or (8 if dry else 128)
    new_tokens = args.new_tokens or (8 if dry else 256)
    repeats = args.repeats or (1 if dry else 5)
    page_size = 8 if dry else 64
    bandwidth = measure_bandwidth(2**20 if dry else 2**30, repeats)
    kernel = check_and_time_kernel(model, batch=4 if dry else 64, context=args.context or (40 if dry else 4096),
                                   page_size=page_size, interpret=dry, repeats=repeats)
    kernel["of_bandwidth"] = kernel["gb_per_s"] * 1e9 / bandwidth
    engines = []
    for batch in batches:
        result = engine_decode(model, batch, prompt_len, new_tokens, page_size, repeats)
        result["bound_tokens_per_s"] = batch * bandwidth / result["bytes_per_step"]
        result["of_bound"] = result["tokens_per_s"] / result["bound_tokens_per_s"]
        engines.append(result)
    report = {"device": str(jax.devices()[0].device_kind), "platform": platform, "dry_run": dry,
              "model": args.model or ("tiny" if dry else "qwen2.5-1.5b"), "bandwidth_gb_per_s": bandwidth / 1e9,
              "kernel": kernel, "engine": engines}
    print(json.dumps(report, indent=2))
    if not kernel["matches_reference"]:
        parser.exit(1, f"gpu_decode: the kernel differs from the reference by {kernel['max_abs_error']:.3g}\n")
    return report


if __name__ == "__main__":
    main()
