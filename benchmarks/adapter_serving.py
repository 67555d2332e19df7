"""Serving a LoRA adapter version: merged into the kernels against run on the fly, in one run.

For each model (random Qwen2-shaped weights, float32; LoRA rank ``--rank`` on q, k, v, o, gate, up,
down) it builds one engine per ``engine.lora_mode`` on the same base and measures, alternating the
modes so that load drift reaches both:

  swap_s          ``update_adapters`` of a new adapter version until the engine's params are ready
                  (merged: the rank-r products and additions; on the fly: the adapters' relayout only);
                  best of the repeats, after the first version compiled everything
  tokens_per_s    new tokens / best wall time of ``generate`` (``--batch`` prompts of 32 tokens,
                  ``--new-tokens`` forced new tokens each, greedy), on the adapter version
  base_tokens_per_s  the same engine config on the base alone (no adapters): the baseline

and from them ``on_the_fly_vs_merged`` (tokens/s ratio, swap ratio) and ``break_even_tokens``: the
tokens one version must generate before the mode with the faster decode pays back its slower swap.
``auto`` is the mode that is faster per version at ``--tokens-per-version`` (default: one quickstart
step's rollouts, 64 completions of 64 tokens). Prints one JSON object.

    python benchmarks/adapter_serving.py
    python benchmarks/adapter_serving.py --models tiny --repeats 1 --new-tokens 8   # seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlax_core.inference import Engine, EngineConfig, Request, SamplingParams  # noqa: E402
from rlax_core.models import ModelConfig, init_params  # noqa: E402
from rlax_core.models.lora import init_adapters  # noqa: E402
from rlax_core.models.lora_config import LoraConfig  # noqa: E402

QWEN2 = dict(architecture="qwen2", qkv_bias=True, tie_word_embeddings=True)
MODELS = {
    "tiny": ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, **QWEN2),
    # benchmarks/generate.py's and weight_sync.py's 25M config
    "25m": ModelConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_layers=8, num_heads=8,
                       num_kv_heads=4, head_dim=64, **QWEN2),
}
PROMPT_LEN = 32
MODES = ("merged", "on_the_fly")


def random_adapters(model: ModelConfig, lora: LoraConfig, seed: int):
    """Adapters with B != 0 (fresh ones are zero): a version the engine really has to apply."""
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    return jax.tree.map(lambda x: np.asarray(0.02 * jax.random.normal(next(keys), x.shape)),
                        init_adapters(model, lora, next(keys)))


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, model: ModelConfig, lora: LoraConfig, *, batch: int, new_tokens: int, repeats: int,
            tokens_per_version: int) -> dict:
    params = init_params(model, jax.random.key(0))
    config = EngineConfig(num_slots=batch, page_size=16, num_pages=batch * ((PROMPT_LEN + new_tokens) // 16 + 2) + 1,
                          max_prompt_len=PROMPT_LEN, max_new_tokens=new_tokens, prefill_buckets=(PROMPT_LEN,),
                          decode_steps_per_call=16)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    rng = np.random.default_rng(0)
    requests = [Request(rng.integers(3, model.vocab_size, PROMPT_LEN).tolist(), sampling, f"p{i}") for i in range(batch)]
    produced = batch * new_tokens

    engines = {mode: Engine(dataclasses.replace(config, lora_mode=mode), model, params) for mode in MODES}
    base_engine = engines["merged"]
    base_engine.generate(requests)  # compiles
    base_best = min(_seconds(lambda: base_engine.generate(requests)) for _ in range(repeats))
    compile_s = {}
    for mode, engine in engines.items():  # the first adapter version: on the fly compiles its programs here
        engine.update_adapters(random_adapters(model, lora, 1), lora, 1)
        compile_s[mode] = _seconds(lambda: engine.generate(requests))
    swap, decode = {mode: [] for mode in MODES}, {mode: [] for mode in MODES}
    for repeat in range(repeats):
        adapters = random_adapters(model, lora, 2 + repeat)
        for mode, engine in engines.items():
            swap[mode].append(_seconds(lambda: (engine.update_adapters(adapters, lora, 2 + repeat),
                                                jax.block_until_ready(engine.params))))
            decode[mode].append(_seconds(lambda: engine.generate(requests)))
    report = {"model": name, "rank": lora.rank, "batch": batch, "new_tokens": new_tokens,
              "base_tokens_per_s": produced / base_best}
    for mode in MODES:
        report[mode] = {"swap_s": min(swap[mode]), "tokens_per_s": produced / min(decode[mode]),
                        "first_version_generate_s": compile_s[mode]}
    merged, fly = report["merged"], report["on_the_fly"]
    report["on_the_fly_vs_merged"] = {"tokens_per_s": fly["tokens_per_s"] / merged["tokens_per_s"],
                                      "swap_s": fly["swap_s"] / merged["swap_s"]}
    report["merged_vs_base_tokens_per_s"] = merged["tokens_per_s"] / report["base_tokens_per_s"]
    per_token = {mode: 1.0 / report[mode]["tokens_per_s"] for mode in MODES}
    slower_decode = max(MODES, key=per_token.get)
    faster_decode = min(MODES, key=per_token.get)
    swap_saving = report[faster_decode]["swap_s"] - report[slower_decode]["swap_s"]
    # Tokens after which the faster decoder's time saved exceeds its extra swap time (0: it swaps faster too).
    report["break_even_tokens"] = max(0.0, swap_saving / (per_token[slower_decode] - per_token[faster_decode])) \
        if per_token[slower_decode] > per_token[faster_decode] else 0.0
    per_version = {mode: report[mode]["swap_s"] + tokens_per_version * per_token[mode] for mode in MODES}
    report["tokens_per_version"] = tokens_per_version
    report["seconds_per_version"] = per_version
    report["auto"] = min(MODES, key=per_version.get)
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="25m", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens-per-version", type=int, default=64 * 64)
    args = parser.parse_args(argv)
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank)
    results = [measure(name, MODELS[name], lora, batch=args.batch, new_tokens=args.new_tokens, repeats=args.repeats,
                       tokens_per_version=args.tokens_per_version) for name in args.models.split(",")]
    report = {"platform": jax.devices()[0].platform, "results": results, "load_average": list(os.getloadavg())}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
