"""Generation throughput of the rollout engine against Hugging Face transformers ``generate``.

For each model and batch size (32-token prompts, 128 forced new tokens, greedy, float32) it
measures in one run:

  tokens_per_s                the engine (new tokens / best wall time of generate(), compiled beforehand;
                              its repeats alternate with transformers' so that drift reaches both,
                              and continue until each side has run --min-seconds in all):
                              a ReplicatedEngine with one replica per CPU core (each core a JAX
                              device, rlax_core.utils.devices), the batch dealt across them, as
                              transformers gets every core as threads
  transformers_tokens_per_s   transformers' generate on the very same weights (our save_pretrained)
  vs_transformers             the ratio of the two
  mfu                         engine tokens/s x model FLOPs per token / this CPU's float32 matmul peak
  bandwidth_bound_tokens_per_s  (batch 1) memory bandwidth measured here / bytes read per decode step
                              (all weights + the KV cache); of_bandwidth_bound is the engine's share

Models: "stories260K" (the real llama2.c checkpoint) and "25m" (a random Qwen2-shaped config:
hidden 512, intermediate 1408, 8 layers, 8 heads, 4 KV heads, vocab 32000, tied). Prints one JSON object.

    python benchmarks/generate.py
    python benchmarks/generate.py --models 25m --batches 64 --no-torch
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
sys.path.insert(0, str(REPO / "benchmarks"))

import baselines  # noqa: E402  (the baselines' fair settings)
import forward as forward_benchmark  # noqa: E402  (the same models and matmul peak as the forward benchmark)
from rlax_core.inference import EngineConfig, ReplicatedEngine, Request, SamplingParams  # noqa: E402
from rlax_core.models import Model  # noqa: E402
from rlax_core.utils.devices import use_cpu_cores_as_devices  # noqa: E402

PROMPT_LEN, NEW_TOKENS = 32, 128
# The transformers baseline: float32 and SDPA attention (from_pretrained), greedy with the KV cache (generate).
TRANSFORMERS_LOAD = baselines.TRANSFORMERS_LOAD_FAIR
TRANSFORMERS_GENERATE = dict(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0,
                             **baselines.TRANSFORMERS_GENERATE_FAIR)


def memory_bandwidth(megabytes: int = 512, repeats: int = 10) -> float:
    """Bytes per second read by a jitted sum over an array much larger than the caches."""
    data = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    seconds = forward_benchmark.best_time(lambda: total(data).block_until_ready(), repeats)
    return data.nbytes / seconds


def engine_runner(model: Model, prompts: np.ndarray, steps_per_call: int, replicas: int):
    """generate() of the 128 new tokens for every prompt, by ``replicas`` engines dealt the batch."""
    replicas = min(replicas, len(prompts))
    slots = -(-len(prompts) // replicas)
    page_size = 16
    config = EngineConfig(num_slots=slots, page_size=page_size, num_pages=slots * (PROMPT_LEN + NEW_TOKENS) // page_size + 1,
                          max_prompt_len=PROMPT_LEN, max_new_tokens=NEW_TOKENS, prefill_buckets=(PROMPT_LEN,),
                          decode_steps_per_call=steps_per_call)
    engine = ReplicatedEngine(config, model.config, model.params, devices=jax.local_devices()[:replicas])
    sampling = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [Request(p.tolist(), sampling, prompt_id=i) for i, p in enumerate(prompts)]

    def run():
        completions = engine.generate(requests)
        assert all(len(c.completion_ids) == NEW_TOKENS for c in completions)

    return run


def transformers_runner(model: Model, prompts: np.ndarray):
    """transformers' generate of the same tokens on the same weights; None without the bench extra."""
    reference = forward_benchmark.transformers_copy(model, TRANSFORMERS_LOAD)
    if reference is None:
        return None
    import torch

    ids = torch.from_numpy(prompts.astype(np.int64))
    mask = torch.ones_like(ids)

    def run():
        with torch.inference_mode():
            out = reference.generate(ids, attention_mask=mask, **TRANSFORMERS_GENERATE)
        assert out.shape[1] == PROMPT_LEN + NEW_TOKENS

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="stories260K,25m")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds, at least")
    parser.add_argument("--min-seconds", type=float, default=6.0,
                        help="more rounds (up to 30) until each contender has run this long in all")
    parser.add_argument("--steps-per-call", type=int, default=64, help="decode steps per compiled call")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers comparison")
    parser.add_argument("--replicas", type=int, default=0, help="engine replicas, one per CPU device (0: one per core)")
    args = parser.parse_args()
    replicas = use_cpu_cores_as_devices(args.replicas or None)  # default: one device, and replica, per core

    peak = forward_benchmark.matmul_peak(args.matmul_size, 10)  # best of 10: a conservative (high) peak
    bandwidth = memory_bandwidth()
    print(f"peak {peak / 1e9:.1f} GFLOP/s, bandwidth {bandwidth / 1e9:.2f} GB/s", file=sys.stderr, flush=True)
    results = {}
    for name in args.models.split(","):
        model = forward_benchmark.load(name)
        config = model.config
        param_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
        # Mean context over the decode: the prompt plus half the new tokens.
        flops_per_token = config.flops_per_token(PROMPT_LEN + NEW_TOKENS // 2)
        entries = {}
        for batch in map(int, args.batches.split(",")):
            prompts = np.random.default_rng(batch).integers(3, config.vocab_size, (batch, PROMPT_LEN), dtype=np.int32)
            runners = [engine_runner(model, prompts, args.steps_per_call, replicas)]
            reference = None if args.no_torch else transformers_runner(model, prompts)
            if reference is not None:
                runners.append(reference)
            # Engine and transformers take turns, so that a drift in the machine's speed reaches both.
            seconds = forward_benchmark.best_times_interleaved(runners, args.repeats, args.min_seconds)
            tokens_per_s = batch * NEW_TOKENS / seconds[0]
            entry = {"tokens_per_s": round(tokens_per_s, 1), "mfu": round(tokens_per_s * flops_per_token / peak, 4)}
            if batch == 1:
                kv_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4 * (PROMPT_LEN + NEW_TOKENS // 2)
                bound = bandwidth / (param_bytes + kv_bytes)
                entry["bandwidth_bound_tokens_per_s"] = round(bound, 1)
                entry["of_bandwidth_bound"] = round(tokens_per_s / bound, 3)
            if reference is not None:
                entry["transformers_tokens_per_s"] = round(batch * NEW_TOKENS / seconds[1], 1)
                entry["vs_transformers"] = round(seconds[1] / seconds[0], 2)
            entries[f"batch_{batch}"] = entry
            print(f"{name} batch {batch}: {entry}", file=sys.stderr, flush=True)
        results[name] = {"params": config.num_params, "param_bytes": param_bytes,
                         "flops_per_token": flops_per_token, **entries}

    print(json.dumps({
        "benchmark": "generate", "backend": jax.default_backend(), "dtype": baselines.OUR_DTYPE,
        "engine_replicas": replicas,
        "transformers_settings": None if args.no_torch else baselines.transformers_settings(TRANSFORMERS_LOAD,
                                                                                              TRANSFORMERS_GENERATE),
        "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS, "greedy": True,
        "min_repeats": args.repeats, "min_seconds_per_contender": args.min_seconds,
        "peak_matmul_flops": round(peak), "memory_bandwidth_bytes_per_s": round(bandwidth),
        "models": results,
    }, indent=2))


if __name__ == "__main__":
    main()
