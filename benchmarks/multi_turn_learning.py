"""The CPU demonstration that multi-turn RL learns: stories260K on word_chain, GRPO on episodes.

    .venv/bin/python benchmarks/multi_turn_learning.py --steps 30 > learning.json

Each episode is two story paragraphs; turn k passes when its paragraph uses the k-th word exactly once
and is well formed (``rlax_core.envs.word_chain``); the reward is per turn. Held-out success is the
share of an episode's turns that passed, averaged over episodes sampled at the training temperature
on prompts whose names and scenes training never sees, before and after; the JSON gives both with
their standard errors and the rise in standard errors of the difference (and the share of episodes
that passed every turn). Fluency beside it: distinct-2 of the
policy's paragraphs, so a reader sees the policy stayed a storyteller.

Everything is the project's own path: episodes on the engine with prefix reuse (``run_episodes``),
rows with policy masks (``Episode.rollout_fields``), ``make_batch`` and the trainer's GRPO step, and
the new weights swapped into the engine after every step (synchronous RL).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table  # noqa: E402
from rlax_core.envs import EnvConfig, EpisodeStart, run_episodes  # noqa: E402
from rlax_core.inference.config import EngineConfig, SamplingParams  # noqa: E402
from rlax_core.inference.engine import Engine  # noqa: E402
from rlax_core.models import from_pretrained  # noqa: E402
from rlax_core.models.tokenizer import load_tokenizer  # noqa: E402
from rlax_core.parallel import MeshConfig, make_mesh  # noqa: E402
from rlax_core.rl.presets import get_preset  # noqa: E402
from rlax_core.tasks.story import distinct_n, story_examples  # noqa: E402
from rlax_core.training.batching import make_batch  # noqa: E402
from rlax_core.training.config import OptimizerConfig, TrainerConfig  # noqa: E402
from rlax_core.training.step import Trainer  # noqa: E402

MODEL = REPO / "pipelines" / "assets" / "stories260K"


def evaluate(engine, tokenizer, env: EnvConfig, examples, sampling, seed: int, samples: int) -> dict:
    """Held-out success: per episode the share of its turns that passed (the task is rewarded per
    turn), its mean and standard error over episodes; beside it every turn's pass rate, the share of
    episodes that passed every turn, and distinct-2 of the paragraphs."""
    starts = [EpisodeStart(row, prompt_id=f"eval-{i}", seed=seed, samples=samples) for i, row in enumerate(examples)]
    episodes = run_episodes(engine, tokenizer, env, starts, sampling)
    per_turn = np.asarray([[k < len(e.turns) and bool(e.turns[k]["info"].get("turn_pass")) for k in range(env.max_turns)]
                           for e in episodes], float)
    success = per_turn.mean(axis=1)
    texts = [turn["text"] for e in episodes for turn in e.turns]
    return {"success": float(success.mean()), "stderr": float(success.std(ddof=1) / math.sqrt(len(success))),
            "episodes": len(episodes), "turn_pass": per_turn.mean(axis=0).tolist(),
            "all_turns_pass": float(per_turn.min(axis=1).mean()), "distinct_2": distinct_n(texts, 2),
            "mean_return": float(np.mean([e.reward for e in episodes]))}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    parser.add_argument("--samples", type=int, default=8, help="episodes per prompt (G)")
    parser.add_argument("--heldout", type=int, default=64, help="held-out prompts, before and after")
    parser.add_argument("--heldout-samples", type=int, default=2, help="episodes per held-out prompt")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--words", default="happy,ball", help="the word each turn must use, in order")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    model, tokenizer = from_pretrained(MODEL), load_tokenizer(MODEL)
    words = args.words.split(",")
    env = EnvConfig(name="word_chain", tools=(), max_turns=len(words), max_turn_tokens=48, max_tokens=160,
                    judge_answer=False, options={"words": words})
    engine = Engine(EngineConfig(num_slots=64, page_size=16, num_pages=64 * 10 + 1, max_prompt_len=64,
                                 max_new_tokens=96, prefill_buckets=(64,), decode_steps_per_call=16,
                                 attention_impl="window"),
                    model.config, model.params, detokenize=tokenizer.decode)
    newline = tokenizer.encode("\n", add_bos=False)[-1]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48, stop_token_ids=(newline,))
    trainer_config = TrainerConfig(max_seq_len=env.max_tokens, mesh=MeshConfig(fsdp=1), groups_per_step=args.prompts,
                                   optimizer=OptimizerConfig(learning_rate=args.learning_rate, schedule="constant",
                                                             max_grad_norm=1.0))
    trainer = Trainer(model.config, get_preset("grpo"), trainer_config, make_mesh(trainer_config.mesh, jax.devices()[:1]))
    state = trainer.init_state(model.params)
    reference = jax.tree.map(jax.numpy.copy, state.params)
    heldout = story_examples("heldout", args.heldout, seed=args.seed)
    train = story_examples("train", args.steps * args.prompts, seed=args.seed)

    started = time.monotonic()
    before = evaluate(engine, tokenizer, env, heldout, sampling, 10_000 + args.seed, args.heldout_samples)
    history = []
    for step in range(args.steps):
        rows = train[step * args.prompts:(step + 1) * args.prompts]
        starts = [EpisodeStart(row, prompt_id=f"s{step}-{i}", seed=args.seed * 100_003 + step, samples=args.samples)
                  for i, row in enumerate(rows)]
        episodes = run_episodes(engine, tokenizer, env, starts, sampling)
        tables = []
        for i, row in enumerate(rows):
            group = episodes[i * args.samples:(i + 1) * args.samples]
            tables.append(to_table([{"example_id": row["id"], "group_id": f"demo/{step}/{i}", "sample_idx": e.sample_index,
                                     "reward_info": None, **e.rollout_fields()} for e in group], ROLLOUT_SCHEMA))
        batch = make_batch(tables, max_seq_len=env.max_tokens, row_multiple=trainer.row_multiple)
        state, metrics = trainer.step(state, batch, reference)
        engine.update_weights(jax.device_get(state.params), version=step + 1)
        history.append({"step": step, "mean_return": float(np.mean([e.reward for e in episodes])),
                        "success": float(np.mean([bool(e.turns[-1]["info"].get("pass", False)) for e in episodes])),
                        "mismatch_kl": float(metrics["mismatch_kl"])})
        print(json.dumps(history[-1]), file=sys.stderr, flush=True)
    after = evaluate(engine, tokenizer, env, heldout, sampling, 10_000 + args.seed, args.heldout_samples)
    rise = after["success"] - before["success"]
    spread = math.sqrt(before["stderr"] ** 2 + after["stderr"] ** 2)  # 0 when every episode scored alike
    result = {"benchmark": "multi_turn_learning", "model": "stories260K", "environment": "word_chain",
              "words": words, "steps": args.steps, "episodes_per_step": args.prompts * args.samples,
              "seconds": time.monotonic() - started, "before": before, "after": after,
              "rise": rise, "rise_in_stderr": rise / spread if spread > 0 else None,
              "history": history}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
