"""Sequences per decode step with pages on demand against whole-budget reservations, one small pool.

    .venv/bin/python benchmarks/engine_memory.py --repeats 3

A decode-dominated long-tail workload on stories260K (CPU, float32, one engine, the same config but
``engine.admission``): every sample may take ``--budget`` new tokens; most write a story to its end
(EOS, a few hundred tokens) and one prompt in ``--long-every`` ignores EOS and runs to the budget.
The pool holds ``--pool-budgets`` whole budgets.

* ``reserve`` (the baseline, the engine before pages on demand): a sample is admitted when its whole
  budget's pages are free, so the pool bounds the running sequences at ``--pool-budgets``.
* ``on_demand``: a sample takes its prompt's pages and one decode call's look-ahead and grows as it
  writes; the pool running out preempts the sample queued last, which later resumes.

The headline is ``mean_running``: sequences decoding at once (tokens per decode step), what an
accelerator's decode step is paid for by (it reads the weights once a step however many sequences
run). ``tokens_per_s`` stands beside it: on a CPU a decode step costs more as more sequences run, so
its ratio is not the accelerator's. Both sides run the same requests, warmed up first (neither pays
for compilation), ``--repeats`` times interleaved (a slow moment of the machine hits both); each
side's best run counts. One more run per side synchronizes after every compiled call to split its
time between prefill (prompts and preempted samples' recomputation) and decode
(``seconds_split``; that run's time is not the tokens/s one). ``tokens_identical``: every token of every
sample equal in both and in a run on a pool that holds every sample's budget. The pools admit
different prompts together, so the engines run ``batch_invariant`` (one compiled prefill batch, one
decode window width): otherwise a prompt's keys depend on its prefill batch in the last bits, and one
sampled token in about 10^4 parts (docs/inference.md). ``--preemption swap`` (the default) copies a
preempted sample's pages to host memory and back, bit for bit; ``recompute`` computes them again,
which keeps its tokens unless a draw falls within rounding of a boundary. The time split has a
``swap`` phase when pages were swapped. The JSON carries the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlax_core.inference.config import EngineConfig, SamplingParams  # noqa: E402
from rlax_core.inference.engine import Engine, Request  # noqa: E402
from rlax_core.inference.phase_clock import PhaseClock  # noqa: E402
from rlax_core.inference.sampling import SamplingMode  # noqa: E402
from rlax_core.models import from_pretrained  # noqa: E402
from rlax_core.models.tokenizer import load_tokenizer  # noqa: E402
from rlax_core.tasks.story import story_examples  # noqa: E402

MODEL = REPO / "pipelines" / "assets" / "stories260K"
PROMPT_TOKENS = 16
RESUME_CHUNK = 256


def workload(tokenizer, prompts: int, samples: int, budget: int, long_every: int, stop: str) -> list[Request]:
    """Prompts of the stories' openings; most samples write to the story's end (EOS: 240-530 tokens
    for stories260K at temperature 1), or with ``stop="period"`` to their first full stop (a few dozen,
    for a quick run); every ``long_every``-th prompt's samples ignore EOS and run to the budget."""
    period = tokenizer.encode(".", add_bos=False)[-1]
    rows = story_examples("train", prompts)
    requests = []
    for i, row in enumerate(rows):
        long = i % long_every == long_every - 1
        stops = (period,) if stop == "period" and not long else ()
        sampling = SamplingParams(temperature=1.0, max_new_tokens=budget, samples_per_prompt=samples,
                                  stop_token_ids=stops, ignore_eos=long)
        requests.append(Request(tokenizer.encode(row["prompt"], add_bos=True)[:PROMPT_TOKENS], sampling,
                                prompt_id=i, seed=17))
    return requests


def resume_buckets(longest: int) -> tuple[int, ...]:
    """The prompts' bucket and powers of 4 up to the longest sample a preempted one recomputes, at
    most ``RESUME_CHUNK``: a longer history is recomputed in chunks of the largest bucket
    (``continuation.feed_uncached``). A bucket as long as the budget (4096 tokens for 1,040) made
    warm-up compile a continuation of every slot at that length, 25.8 GB on XLA:CPU."""
    buckets = [PROMPT_TOKENS]
    while buckets[-1] < min(longest, RESUME_CHUNK):
        buckets.append(buckets[-1] * 4)
    return tuple(buckets)


def timed(engine: Engine, requests: list[Request]) -> tuple[float, list, dict]:
    before = dict(engine.stats)
    started = time.perf_counter()
    completions = engine.generate(requests)
    seconds = time.perf_counter() - started
    return seconds, completions, {name: engine.stats[name] - before[name] for name in engine.stats}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--stop", choices=("eos", "period"), default="eos")
    parser.add_argument("--long-every", type=int, default=8)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--pool-budgets", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--preemption", choices=("swap", "recompute"), default="swap")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    model, tokenizer = from_pretrained(MODEL), load_tokenizer(MODEL)
    requests = workload(tokenizer, args.prompts, args.samples, args.budget, args.long_every, args.stop)
    page_size = 16
    budget_pages = -(-(PROMPT_TOKENS + args.budget) // page_size)
    # Buckets past the prompts' for a resumed sample: it recomputes its prompt and tokens so far.
    small = EngineConfig(num_slots=args.slots, page_size=page_size, max_prompt_len=PROMPT_TOKENS,
                         max_new_tokens=args.budget, prefill_buckets=resume_buckets(PROMPT_TOKENS + args.budget),
                         decode_steps_per_call=16, attention_impl="window", batch_invariant=True,
                         preemption=args.preemption,
                         num_pages=args.pool_budgets * budget_pages + 1)
    big = dataclasses.replace(small, num_pages=args.slots * budget_pages + 1)
    engines = {admission: Engine(dataclasses.replace(small, admission=admission), model.config, model.params)
               for admission in ("reserve", "on_demand")}
    for engine in engines.values():
        engine.warm_up(modes=(SamplingMode.TEMPERATURE,))
    reference = Engine(dataclasses.replace(big, admission="reserve"), model.config, model.params).generate(requests)

    best: dict[str, tuple[float, list, dict]] = {}
    for _ in range(args.repeats):  # interleaved: a slow moment of the shared machine hits both sides
        for name, engine in engines.items():
            run = timed(engine, requests)
            if name not in best or run[0] < best[name][0]:
                best[name] = run
    sides = {}
    for name, (seconds, _, stats) in best.items():
        sides[name] = {"seconds": seconds, "tokens": stats["tokens"], "tokens_per_s": stats["tokens"] / seconds,
                       "decode_steps": stats["decode_steps"], "mean_running": stats["tokens"] / stats["decode_steps"],
                       "peak_pages_in_use": engines[name].pages.peak_in_use}
    sides["on_demand"]["preemptions"] = best["on_demand"][2]["preemptions"]
    for name, engine in engines.items():  # the synchronized run: where each side's time goes
        engine.clock = clock = PhaseClock()
        timed(engine, requests)
        engine.clock = None
        total = sum(clock.seconds.values())
        sides[name]["seconds_split"] = {phase: {"seconds": seconds, "share": seconds / total}
                                        for phase, seconds in clock.seconds.items()}
    tokens = lambda completions: [c.completion_ids for c in completions]
    logprobs = lambda completions: [c.logprobs for c in completions]
    lengths = sorted(len(c.completion_ids) for c in reference)
    out = {"benchmark": "engine_memory", "model": "stories260K", "dtype": "float32", "slots": args.slots,
           "preemption": args.preemption, "batch_invariant": small.batch_invariant,
           "pool_pages": small.num_pages - 1, "budget_pages": budget_pages, "samples": len(reference),
           "completion_tokens": {"mean": sum(lengths) / len(lengths), "median": lengths[len(lengths) // 2],
                                 "max": lengths[-1]},
           "repeats_interleaved": args.repeats, **sides,
           "running_ratio": sides["on_demand"]["mean_running"] / sides["reserve"]["mean_running"],
           "tokens_per_s_ratio": sides["on_demand"]["tokens_per_s"] / sides["reserve"]["tokens_per_s"],
           "tokens_identical": tokens(best["reserve"][1]) == tokens(best["on_demand"][1]) == tokens(reference),
           "logprobs_identical": logprobs(best["reserve"][1]) == logprobs(best["on_demand"][1]) == logprobs(reference),
           "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
