"""``benchmarks/engine_memory.py`` run small, so that it cannot rot: both admissions on one small
pool give a big pool's tokens, and pages on demand run more sequences at once; its buckets stop at
the recomputation's chunk."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.mark.slow  # two engines and a reference run
def test_engine_memory_benchmark_runs_both_admissions_on_one_small_pool():
    import engine_memory

    out = engine_memory.main(["--prompts", "8", "--samples", "2", "--budget", "64", "--long-every", "4",
                              "--slots", "8", "--pool-budgets", "2", "--repeats", "1", "--stop", "period"])
    # Batch-invariant engines and swapped preemptions: bit for bit a big pool's, log-probs too.
    assert out["tokens_identical"] is True and out["logprobs_identical"] is True
    assert out["batch_invariant"] is True and out["preemption"] == "swap"
    assert out["reserve"]["tokens"] == out["on_demand"]["tokens"] > 0
    assert out["on_demand"]["mean_running"] > out["reserve"]["mean_running"]
    assert out["running_ratio"] == out["on_demand"]["mean_running"] / out["reserve"]["mean_running"]
    for side in ("reserve", "on_demand"):  # where the time goes, from a run that waits for every program
        split = out[side]["seconds_split"]
        assert split["prefill"]["seconds"] > 0 and split["decode"]["seconds"] > 0
        assert sum(phase["share"] for phase in split.values()) == pytest.approx(1.0)  # a swap phase too
    assert out["on_demand"]["preemptions"] >= 0 and out["on_demand"]["peak_pages_in_use"] <= out["pool_pages"]
    assert out["completion_tokens"]["median"] < out["completion_tokens"]["max"] == 64  # a long tail


def test_the_benchmark_buckets_stop_at_the_recomputation_chunk():
    """A 1,040-token sample resumes in chunks of the largest bucket: no bucket as long as the
    budget, whose warm-up at every slot asked XLA:CPU for 25.8 GB."""
    import engine_memory

    assert engine_memory.resume_buckets(16 + 1024) == (16, 64, 256)
    assert engine_memory.resume_buckets(16 + 40) == (16, 64)
