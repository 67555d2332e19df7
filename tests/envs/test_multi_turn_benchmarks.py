"""docs/multi_turn.md's two commands, run small: the prefix-reuse benchmark and the learning demonstration."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_the_docs_name_both_commands():
    docs = (REPO / "docs" / "multi_turn.md").read_text()
    assert re.search(r"python benchmarks/multi_turn\.py --episodes \d+ --turns \d+", docs)
    assert re.search(r"python benchmarks/multi_turn_learning\.py --steps \d+", docs)


@pytest.mark.slow  # compiles an engine for each side
def test_prefix_reuse_benchmark_runs_both_sides_on_the_same_episodes():
    import multi_turn

    out = multi_turn.main(["--episodes", "4", "--turns", "2", "--turn-tokens", "8", "--observation-tokens", "8",
                           "--slots", "4", "--repeats", "1"])
    reuse, baseline = out["prefix_reuse"], out["reprefill"]
    assert reuse["prefill_calls"] >= 1 and reuse["extend_calls"] >= 1 and baseline["extend_calls"] == 0
    # Re-prefilling computes every turn's whole history again; prefix reuse computes per continued turn
    # the last sampled token and the observation but its last token (the first decode step runs that).
    assert reuse["observation_tokens_computed"] == 4 * 8
    assert baseline["prefill_calls"] > reuse["prefill_calls"] and out["speedup"] > 0


@pytest.mark.slow  # a train step and three rounds of episodes
def test_learning_demonstration_runs_and_reports_before_and_after():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "multi_turn_learning.py"), "--steps", "1",
                             "--prompts", "2", "--samples", "2", "--heldout", "2"],
                            capture_output=True, text=True, timeout=900, check=True)
    import json

    out = json.loads(result.stdout)
    assert out["before"]["episodes"] == out["after"]["episodes"] == 4
    assert len(out["history"]) == 1 and {"rise", "rise_in_stderr"} <= set(out)
