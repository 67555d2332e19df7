"""Verifier throughput: math and code verifications per second with 1 and 2 workers.

Measured in the same run against named baselines that do the same work without our protections:

  math_baseline_inprocess   math-verify called directly in this process: no pool, no hard timeout
                            (a pathological answer would hang the caller)
  math_pool_w{1,2}          MathVerifier: math-verify in a killable process pool, 1 and 2 workers
  code_baseline_subprocess  each program run as ``python -I -S -c`` in a plain subprocess, one at a
                            time: no namespaces, no chroot, no uid drop, no limits
  code_sandbox_w{1,2}       CodeVerifier: the full sandbox, 1 and 2 checks at a time
  mbpp_*                    the same two for small checks: MBPP programs with their 3 asserts

Ratios are ours / baseline (above 1: faster than the baseline). Inputs are real: MATH-500 gold
answers against a rewritten form of themselves (``gold + 0``, which the fast path cannot shortcut,
so every pair goes through math-verify; both sides first warm up on 50 other answers), and
HumanEval canonical solutions with their tests (from ../shared/data, else the repository's fixtures).
Pathological answers (an exponent tower, a megabyte of digits...): seconds until the caller has its
verdict with a 3 s hard timeout, beside an ordinary comparison; and an ordinary comparison on the
worker that replaces one killed at the hard limit, beside one on a worker that has served before
(``first_after_a_kill_vs_ordinary``: about 1 when replacements are warm forks). Prints one JSON object.

    python benchmarks/verify.py
    python benchmarks/verify.py --math-pairs 100 --code-programs 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlax_core.rewards.code_verifier import CodeVerifier, build_program, humaneval_tests, mbpp_tests  # noqa: E402
from rlax_core.rewards.math_symbolic import verdict  # noqa: E402
from rlax_core.rewards.math_verifier import EQUAL_REASONS, MathVerifier, MathVerifierConfig  # noqa: E402

SHARED = Path(os.environ.get("RLAX_SHARED_DIR", REPO.parent / "shared")) / "data"
# Without the full datasets beside the checkout, the repository's fixtures (the first 200 MATH-500 rows).
DATA = SHARED if SHARED.is_dir() else REPO / "tests" / "fixtures" / "data"

# Answers that would hang math-verify in the caller's process (tests/rewards/test_math_verifier.py
# checks the verdict on each; here, how long the caller waits for it).
PATHOLOGICAL = {
    "exponent tower": "10^{10^{10^{10}}}",
    "huge power": "9^{9^{9}}",
    "huge factorial": "(10^{100})!",
    "deep parentheses": "(" * 1500 + "1" + ")" * 1500,
    "megabyte of digits": "9" * 1_000_000,
}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def math_pairs(count: int, warmup: int = 50) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(warm-up pairs, measured pairs): disjoint, so that neither side times answers it has cached."""
    rows = _jsonl(DATA / "math" / "math500_test.jsonl")
    pairs = [(row["answer"], f"{row['answer']} + 0") for row in rows]
    return pairs[count:count + warmup], pairs[:count]


def code_jobs(count: int) -> list[tuple[str, object]]:
    rows = _jsonl(DATA / "humaneval" / "HumanEval.jsonl")[:count]
    return [(row["canonical_solution"], humaneval_tests(row)) for row in rows]


def mbpp_jobs(count: int) -> list[tuple[str, object]]:
    """Small checks: MBPP's canonical programs with their three asserts each."""
    rows = _jsonl(DATA / "mbpp" / "mbpp.jsonl")[:count]
    return [(row["code"], mbpp_tests(row)) for row in rows]


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 3)


def bench_math(warmup, pairs, workers: int, timeout: float) -> tuple[float, int]:
    with MathVerifier(MathVerifierConfig(workers=workers, timeout_seconds=timeout)) as verifier:
        verifier.compare_many(warmup)  # start the workers and warm sympy's caches in each
        start = time.perf_counter()
        results = verifier.compare_many(pairs)
        elapsed = time.perf_counter() - start
    return rate(len(pairs), elapsed), sum(r.equal for r in results)


def bench_math_baseline(warmup, pairs, timeout: float) -> tuple[float, int]:
    soft = timeout / 2  # the interval timer, as inside the pool's workers
    for gold, prediction in warmup:  # the same warm-up as the pool's workers get
        verdict(gold, prediction, soft)
    start = time.perf_counter()
    equal = sum(verdict(gold, prediction, soft) in EQUAL_REASONS for gold, prediction in pairs)
    return rate(len(pairs), time.perf_counter() - start), equal


def bench_code_baseline(jobs) -> tuple[float, int]:
    start = time.perf_counter()
    passed = 0
    for completion, tests in jobs:
        source = "\n".join([build_program(completion, tests), tests.setup, *tests.cases])
        done = subprocess.run([sys.executable, "-I", "-S", "-c", source], capture_output=True, timeout=60)
        passed += done.returncode == 0
    return rate(len(jobs), time.perf_counter() - start), passed


def bench_code(jobs, workers: int) -> tuple[float, int]:
    with CodeVerifier(workers=workers) as verifier:
        verifier.check_many(jobs[:workers])  # warm: the mount list and the zygote launcher start once per process
        start = time.perf_counter()
        results = verifier.check_many(jobs)
        elapsed = time.perf_counter() - start
    return rate(len(jobs), elapsed), sum(r.all_passed for r in results)


def bench_pathological(timeout: float) -> dict[str, float]:
    """Seconds until ``compare`` returns on each pathological answer, beside an ordinary comparison's."""
    seconds = {}
    with MathVerifier(MathVerifierConfig(workers=1, timeout_seconds=timeout)) as verifier:
        verifier.compare("\\frac{1}{2}", "0.5")  # the pool's start-up is not part of a comparison
        for name, answer in {"ordinary (baseline)": "\\frac{2}{4}", **PATHOLOGICAL}.items():
            start = time.perf_counter()
            verifier.compare("1", answer)
            seconds[name] = round(time.perf_counter() - start, 3)
    return seconds


def bench_replacement(timeout: float) -> dict[str, float]:
    """Seconds of an ordinary comparison on a worker that has served one, and on the fork replacing a killed one.

    The killed worker is stuck in C (9^(9^9), no interval timer), so only the hard limit ends it;
    its replacement is a fork of the warm parent, which should answer about as fast as the old one.
    """
    config = MathVerifierConfig(workers=1, timeout_seconds=timeout, inner_timeouts=False)
    seconds = {}
    with MathVerifier(config) as verifier:
        verifier.compare("\\frac{1}{2}", "0.5")
        for name, (gold, answer) in {"ordinary (baseline)": ("x^2+2x+1", "(x+1)^2"), "stuck (killed)": ("9^{9^{9}}", "1"),
                                     "first after the kill": ("x^2+2x+1", "(x+1)^2")}.items():
            start = time.perf_counter()
            verifier.compare(gold, answer)
            seconds[name] = round(time.perf_counter() - start, 3)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--math-pairs", type=int, default=200)
    parser.add_argument("--code-programs", type=int, default=40)
    parser.add_argument("--math-timeout", type=float, default=10.0)
    parser.add_argument("--pathological-timeout", type=float, default=3.0)
    args = parser.parse_args()

    (warmup, pairs), jobs = math_pairs(args.math_pairs), code_jobs(args.code_programs)
    out: dict[str, object] = {"cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                              "math_pairs": len(pairs), "code_programs": len(jobs)}
    out["math_baseline_inprocess"], out["math_baseline_equal"] = bench_math_baseline(warmup, pairs, args.math_timeout)
    for workers in (1, 2):
        out[f"math_pool_w{workers}"], out[f"math_pool_w{workers}_equal"] = bench_math(warmup, pairs, workers, args.math_timeout)
        out[f"math_pool_w{workers}_vs_baseline"] = round(out[f"math_pool_w{workers}"] / out["math_baseline_inprocess"], 3)
    for prefix, checks in (("code", jobs), ("mbpp", mbpp_jobs(len(jobs)))):  # HumanEval, then 3-assert checks
        out[f"{prefix}_baseline_subprocess"], out[f"{prefix}_baseline_passed"] = bench_code_baseline(checks)
        for workers in (1, 2):
            ours = f"{prefix}_sandbox_w{workers}"
            out[ours], out[f"{ours}_passed"] = bench_code(checks, workers)
            out[f"{ours}_vs_baseline"] = round(out[ours] / out[f"{prefix}_baseline_subprocess"], 3)
    out["pathological_timeout_s"] = args.pathological_timeout
    out["pathological_seconds"] = bench_pathological(args.pathological_timeout)
    out["pathological_max_over_timeout_s"] = round(
        max(out["pathological_seconds"].values()) - args.pathological_timeout, 3)
    out["replacement_seconds"] = bench_replacement(args.pathological_timeout)
    out["first_after_a_kill_vs_ordinary"] = round(
        out["replacement_seconds"]["first after the kill"] / out["replacement_seconds"]["ordinary (baseline)"], 3)
    out["unit"] = "verifications per second (pathological_*: seconds)"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
