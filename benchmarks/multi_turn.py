"""Episodes per second with prefix reuse against re-prefilling the history, in the same run.

    .venv/bin/python benchmarks/multi_turn.py --episodes 64 --turns 4

Both sides run the same episodes on one engine (stories260K, the same config, the same sampling,
float32): a prompt, then ``turns`` turns of ``turn_tokens`` sampled tokens (EOS ignored, so both do
the same number of decode steps), each followed by a fixed observation of ``observation_tokens``.

* ``prefix_reuse``: the engine's episodes (``Request.episode_tokens``, ``continue_episode``): a
  turn computes only the observation's tokens over the cached history.
* ``reprefill`` (the baseline): each turn is a new request whose prompt is the whole history so far,
  prefilled from scratch, which is what a multi-turn loop over a single-turn engine does.

Each side runs once untimed (compilation), then ``--repeats`` times timed; the JSON gives the best
time of each, episodes/s, the ratio, and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlax_core.inference.config import EngineConfig, SamplingParams  # noqa: E402
from rlax_core.inference.engine import Engine, Request  # noqa: E402
from rlax_core.models import from_pretrained  # noqa: E402
from rlax_core.models.tokenizer import load_tokenizer  # noqa: E402
from rlax_core.tasks.story import story_examples  # noqa: E402

MODEL = REPO / "pipelines" / "assets" / "stories260K"


def run(engine, prompts, observation, turns, sampling, reuse: bool) -> list[list[int]]:
    """Every episode to its end, continuous batching across episodes; the transcripts.

    ``reuse``: the history stays in the episode's pages and a turn computes only its new tokens;
    otherwise every turn is a fresh request whose prompt is the whole history so far."""
    budget = max(map(len, prompts)) + turns * (sampling.max_new_tokens + len(observation))
    transcripts = {i: list(p) for i, p in enumerate(prompts)}
    done_turns = dict.fromkeys(transcripts, 0)
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(prompt, sampling, prompt_id=i, seed=1, episode_tokens=budget if reuse else 0))
    while engine.has_unfinished():
        for _, completion in engine.step():
            i = completion.prompt_id
            transcripts[i] += completion.completion_ids
            done_turns[i] += 1
            if done_turns[i] < turns:
                transcripts[i] += observation
                if reuse:
                    engine.continue_episode(completion.episode, observation, sampling)
                else:
                    engine.add_request(Request(transcripts[i], sampling, prompt_id=i, seed=1))
            elif reuse:
                engine.end_episode(completion.episode)
    return list(transcripts.values())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--observation-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    model, tokenizer = from_pretrained(MODEL), load_tokenizer(MODEL)
    prompts = [tokenizer.encode(row["prompt"], add_bos=True)[:48] for row in story_examples("train", args.episodes)]
    text = " Then they went home and had a nice warm dinner with mom and dad." * 8
    observation = tokenizer.encode(text, add_bos=False)[:args.observation_tokens]
    longest = 48 + args.turns * (args.turn_tokens + len(observation))
    page_size = 16
    buckets = tuple(b for b in (32, 64, 128, 256, 512, 1024) if b < longest) + (longest,)
    config = EngineConfig(num_slots=args.slots, page_size=page_size, max_prompt_len=longest,
                          max_new_tokens=args.turn_tokens, prefill_buckets=buckets,
                          num_pages=args.episodes * -(-(longest + args.turn_tokens) // page_size) + 1,
                          decode_steps_per_call=16, attention_impl="window", max_prefill_batch=16)
    engine = Engine(config, model.config, model.params, detokenize=tokenizer.decode)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.turn_tokens, ignore_eos=True)
    results = {}
    for name, reuse in (("prefix_reuse", True), ("reprefill", False)):
        run(engine, prompts, observation, args.turns, sampling, reuse)  # compiles what this side needs
        times = []
        for _ in range(args.repeats):
            before = dict(engine.stats)
            started = time.perf_counter()
            transcripts = run(engine, prompts, observation, args.turns, sampling, reuse)
            times.append(time.perf_counter() - started)
        assert all(len(t) == len(p) + args.turns * args.turn_tokens + (args.turns - 1) * len(observation)
                   for t, p in zip(transcripts, prompts))
        computed = (engine.stats.get("extended_tokens", 0) - before.get("extended_tokens", 0)
                    if name == "prefix_reuse" else None)
        results[name] = {"seconds": min(times), "episodes_per_s": args.episodes / min(times),
                         "prefill_calls": engine.stats["prefill_calls"] - before["prefill_calls"],
                         "extend_calls": engine.stats.get("extend_calls", 0) - before.get("extend_calls", 0),
                         "observation_tokens_computed": computed}
    out = {"benchmark": "multi_turn", "model": "stories260K", "dtype": "float32", "episodes": args.episodes,
           "turns": args.turns, "turn_tokens": args.turn_tokens, "observation_tokens": len(observation),
           "longest_transcript": longest, "slots": args.slots, **results,
           "speedup": results["prefix_reuse"]["episodes_per_s"] / results["reprefill"]["episodes_per_s"],
           "loadavg": os.getloadavg()}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
