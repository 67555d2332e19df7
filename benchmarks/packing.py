"""One GRPO update on packed rows against the same update on today's padded rows (float32, CPU).

The batch has a long-tail length distribution, as reasoning rollouts do: prompt plus completion
lengths drawn from an exponential with a mean of a quarter of the cap, cut at the cap. The baseline,
in the same run, is the same trainer (same model, dtype, algorithm and settings) stepping on
``make_batch``'s padded rows, each sample padded to ``max_seq_len``; ours steps on
``pack_batch``'s rows of ``row_tokens = max_seq_len``. Both batches are on the devices before the
clock starts; each step's time is the best of ``--repeats``, the two taken in turn. Tokens are real
(non-padding) tokens, the same for both. ``padding_fraction`` is the packed rows' share of padding;
``pack_seconds`` the host's packing time (beside the step, not in it). ``same_loss`` checks that
both took the same update (tests/training/test_packing.py holds every metric and gradient to it).

    python benchmarks/packing.py [--samples 64] [--max-seq-len 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table  # noqa: E402
from rlax_core.models.config import toy_config  # noqa: E402
from rlax_core.parallel import MeshConfig, make_mesh  # noqa: E402
from rlax_core.rl.presets import get_preset  # noqa: E402
from rlax_core.training.batching import make_batch  # noqa: E402
from rlax_core.training.config import TrainerConfig  # noqa: E402
from rlax_core.training.packing import pack_batch, real_tokens  # noqa: E402
from rlax_core.training.step import Trainer  # noqa: E402

from forward import best_times_interleaved  # noqa: E402

SAMPLES_PER_GROUP = 8
# A small Qwen2-shaped model: big enough that the forward and backward dominate the step.
MODEL = toy_config(vocab_size=2048, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                   num_kv_heads=2, head_dim=32, max_position_embeddings=8192)


def long_tail_groups(samples: int, max_seq_len: int, seed: int = 0) -> list:
    """Groups of rollouts whose lengths are exponential with mean max_seq_len / 4, cut at the cap."""
    rng = np.random.default_rng(seed)
    tables = []
    for group in range(-(-samples // SAMPLES_PER_GROUP)):
        prompt = rng.integers(3, MODEL.vocab_size, max(2, max_seq_len // 32)).tolist()
        rows = []
        for sample in range(min(SAMPLES_PER_GROUP, samples - group * SAMPLES_PER_GROUP)):
            total = int(np.clip(rng.exponential(max_seq_len / 4), len(prompt) + 1, max_seq_len))
            completion = rng.integers(3, MODEL.vocab_size, total - len(prompt)).tolist()
            rows.append(dict(example_id=str(group), group_id=f"g{group}", sample_idx=sample, policy_version=0,
                             seed=sample, prompt_ids=prompt, completion_ids=completion,
                             behavior_logprobs=(-rng.random(len(completion))).tolist(), finish_reason="length",
                             reward=float(rng.random()), reward_info="{}"))
        tables.append(to_table(rows, ROLLOUT_SCHEMA))
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.samples < 1 or args.max_seq_len < 64 or args.repeats < 1:
        parser.error("--samples >= 1, --max-seq-len >= 64 and --repeats >= 1")

    config = TrainerConfig(max_seq_len=args.max_seq_len, mesh=MeshConfig(fsdp=1), scan_layers=False)
    trainer = Trainer(MODEL, get_preset("grpo", kl_coef=0.0), config, make_mesh(config.mesh, jax.devices()[:1]))
    padded = make_batch(long_tail_groups(args.samples, args.max_seq_len), max_seq_len=args.max_seq_len,
                        row_multiple=trainer.row_multiple)
    start = time.perf_counter()
    packed = pack_batch(padded, row_tokens=args.max_seq_len, lanes=trainer.lanes, devices=trainer.batch_shards)
    pack_seconds = time.perf_counter() - start
    tokens = real_tokens(padded)
    assert tokens == real_tokens(packed)

    params = trainer.init_state().params
    states, losses = {}, {}

    def stepper(name, batch):
        batch = trainer.put_batch(batch)
        states[name] = trainer.init_state(params)

        def step():
            states[name], metrics = trainer.step(states[name], batch)
            losses.setdefault(name, float(metrics["loss"]))  # the first step's: both start from params

        return step

    padded_s, packed_s = best_times_interleaved([stepper("padded", padded), stepper("packed", packed)], args.repeats)
    rows, row_tokens = packed["tokens"].shape
    result = {
        "load_average": os.getloadavg(),
        "model": {"hidden_size": MODEL.hidden_size, "num_layers": MODEL.num_layers, "vocab_size": MODEL.vocab_size},
        "samples": args.samples, "max_seq_len": args.max_seq_len, "real_tokens": tokens,
        "mean_length_over_cap": tokens / args.samples / args.max_seq_len,
        "padded": {"rows": int(padded["tokens"].shape[0]), "step_s": padded_s, "tokens_per_s": tokens / padded_s},
        "packed": {"rows": rows, "row_tokens": row_tokens, "step_s": packed_s, "tokens_per_s": tokens / packed_s,
                   "pack_seconds": pack_seconds},
        "speedup": padded_s / packed_s,
        "padding_fraction": 1.0 - tokens / (rows * row_tokens),
        "same_loss": bool(np.isclose(losses["padded"], losses["packed"], rtol=1e-5, atol=1e-6)),
    }
    print(json.dumps(result, indent=2))
    if not result["same_loss"]:
        sys.exit(f"the packed update's loss {losses['packed']} differs from the padded one's {losses['padded']}")


if __name__ == "__main__":
    main()
