"""``benchmarks/engine_memory.py`` run small, so that it cannot rot: both admissions on one small
pool give a big pool's tokens, and pages on demand run more sequences at once."""

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
    assert out["tokens_identical"] is True
    assert out["reserve"]["tokens"] == out["on_demand"]["tokens"] > 0
    assert out["on_demand"]["mean_running"] > out["reserve"]["mean_running"]
    assert out["running_ratio"] == out["on_demand"]["mean_running"] / out["reserve"]["mean_running"]
    for side in ("reserve", "on_demand"):  # where the time goes, from a run that waits for every program
        split = out[side]["seconds_split"]
        assert split["prefill"]["seconds"] > 0 and split["decode"]["seconds"] > 0
        assert split["prefill"]["share"] + split["decode"]["share"] == pytest.approx(1.0)
    assert out["on_demand"]["preemptions"] >= 0 and out["on_demand"]["peak_pages_in_use"] <= out["pool_pages"]
    assert out["completion_tokens"]["median"] < out["completion_tokens"]["max"] == 64  # a long tail
