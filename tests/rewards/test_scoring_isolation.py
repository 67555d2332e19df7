"""One sample never fails a batch: its failure is its own reward 0, with a reason and a count.

Only a scorer that cannot work at all (no sandbox can start) stops the job, and that is decided from
a signal the program under test cannot produce: a program that prints the sandbox's own setup-failure
message and exits with its code is a crashed program, scored 0 alone.
"""

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline

from rlax_core.data.records import make_example
from rlax_core.rewards import CodeRewardConfig, RewardConfig, Rewarder
from rlax_core.sandbox.run import SandboxLimits, SandboxUnavailable, run_sandboxed

LIMITS = SandboxLimits(cpu_seconds=3, wall_seconds=6.0, memory_bytes=256 << 20, file_bytes=4 << 20,
                       workdir_bytes=8 << 20)
TESTS = ["assert f(2) == 4", "assert f(3) == 9"]
HONEST = "```python\ndef f(x):\n    return x * x\n```"
# What the sandbox's launcher writes when it cannot build a sandbox, and its exit code: a program's to copy.
FAKE_SETUP_FAILURE = ("```python\nimport os, sys\nsys.stderr.write('sandbox setup failed: OSError: mount /: busy\\n')\n"
                      "sys.stderr.flush()\nos._exit(125)\n```")


def _code_config(**limits) -> RewardConfig:
    return RewardConfig(terms={"code": 1.0}, code=CodeRewardConfig(
        workers=2, per_test_seconds=2.0, limits=SandboxLimits(**{**LIMITS.__dict__, **limits})))


def test_a_program_faking_the_sandbox_setup_failure_scores_0_alone():
    from rlax_core.rewards.registry import Sample

    example = make_example(source="isolation", prompt="write f", task="code", tests=TESTS)
    with Rewarder(_code_config()) as rewarder:
        results = rewarder.score_many([Sample(example, text) for text in (HONEST, FAKE_SETUP_FAILURE, HONEST)])
    assert [reward for reward, _ in results] == [1.0, 0.0, 1.0]
    verdicts = results[1].info["terms"]["code"]["verdicts"]
    assert {v["reason"] for v in verdicts} == {"crashed"} and "exit code 125" in verdicts[0]["detail"], verdicts
    assert rewarder.failures == {}  # a program that crashed was scored; nothing failed to score


def test_a_sandbox_that_cannot_start_stops_the_batch_once():
    from rlax_core.rewards.registry import Sample

    impossible = dict(open_files=1 << 40)  # beyond any kernel's file limit: the launcher's setrlimit fails
    with pytest.raises(SandboxUnavailable, match="sandbox setup failed"):
        run_sandboxed({"main.py": "print(1)"}, ["main.py"], SandboxLimits(**{**LIMITS.__dict__, **impossible}))
    example = make_example(source="isolation", prompt="write f", task="code", tests=TESTS)
    with Rewarder(_code_config(**impossible)) as rewarder:
        with pytest.raises(SandboxUnavailable):
            rewarder.score_many([Sample(example, HONEST), Sample(example, HONEST)])


def _write(path: Path, source: str) -> Path:
    path.write_text(source)
    return path


def test_a_reward_function_that_raises_for_one_sample_costs_that_sample_alone(tmp_path):
    from rlax_core.rewards.registry import Sample

    module = _write(tmp_path / "fragile_reward.py", (
        "import math\n"
        "def fragile(completion, example):\n"
        "    if completion == 'boom':\n"
        "        raise ValueError('cannot read ' + completion)\n"
        "    return math.nan if completion == 'nan' else len(completion) / 10\n"))
    config = RewardConfig(functions={"si_fragile": f"{module}:fragile"}, terms={"si_fragile": 1.0})
    example = {"id": "ex", "prompt": "p", "answer": "", "task": "story"}
    with Rewarder(config) as rewarder:
        results = rewarder.score_many([Sample(example, text) for text in ("ab", "boom", "abcd", "nan")])
    assert [reward for reward, _ in results] == [0.2, 0.0, 0.4, 0.0]
    assert "ValueError: cannot read boom" in results[1].info["scoring_error"]
    assert "score is nan" in results[3].info["scoring_error"]
    assert results[1].info["pass"] is False and "scoring_error" not in results[0].info
    assert rewarder.failures == {"si_fragile": 2}


def test_a_malformed_example_costs_its_own_samples_only():
    from rlax_core.rewards.registry import Sample

    good = {"id": "good", "prompt": "p", "answer": "4", "task": "math"}
    no_answer = {"id": "bad", "prompt": "p", "task": "math"}
    unknown_task = {"id": "odd", "prompt": "p", "answer": "4", "task": "poetry"}
    with Rewarder(RewardConfig(terms={"task": 1.0})) as rewarder:
        results = rewarder.score_many([Sample(good, "\\boxed{4}"), Sample(no_answer, "\\boxed{4}"),
                                       Sample(unknown_task, "\\boxed{4}")])
    assert [reward for reward, _ in results] == [1.0, 0.0, 0.0]
    assert "has no 'answer'" in results[1].info["scoring_error"]
    assert "task 'poetry'" in results[2].info["scoring_error"]
    assert rewarder.failures == {"task": 2}


def test_score_rollouts_isolates_samples_and_counts_failures_on_a_test_pipeline(tmp_path):
    from tests.support.rollout_spec import rollout_spec
    from transforms.rollout import ScoreRollouts

    spec = rollout_spec(tmp_path, run="r", samples_per_prompt=2, rewards=_code_config())
    example = make_example(source="isolation", prompt="write f", task="code", tests=TESTS)
    without_tests = {**example, "id": "no-tests", "tests": None}
    groups = [{"example": example, "texts": [HONEST, FAKE_SETUP_FAILURE]},
              {"example": without_tests, "texts": [HONEST]}]
    for group in groups:
        group["rows"] = [{"completion_ids": [1, 2], "finish_reason": "stop"} for _ in group["texts"]]
    collected = tmp_path / "scored.jsonl"
    pipeline = TestPipeline(runner="BundleBasedDirectRunner")
    (pipeline | beam.Create(groups) | beam.ParDo(ScoreRollouts(spec))
     | beam.Map(lambda g: json.dumps([g["example"]["id"], [[r["reward"], json.loads(r["reward_info"])]
                                                           for r in g["rows"]]]))
     | beam.io.WriteToText(str(collected), shard_name_template=""))
    result = pipeline.run()
    result.wait_until_finish()
    scored = dict(json.loads(line) for line in collected.read_text().splitlines())
    assert [reward for reward, _ in scored[example["id"]]] == [1.0, 0.0]
    assert scored[example["id"]][1][1]["terms"]["code"]["verdicts"][0]["reason"] == "crashed"
    assert [reward for reward, _ in scored["no-tests"]] == [0.0]
    assert "has no 'tests'" in scored["no-tests"][0][1]["scoring_error"]
    failed = result.metrics().query(MetricsFilter().with_name("samples_failed"))["counters"]
    assert sum(counter.committed for counter in failed) == 1


def test_the_outer_timeout_kills_a_handler_that_never_reports():
    import os
    import signal
    import subprocess
    import sys

    from rlax_core.sandbox.run import read_reply

    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    read_end, write_end = os.pipe()
    os.write(write_end, b"%d\n" % stuck.pid)  # a handler's first line: its pid, then silence
    with pytest.raises(TimeoutError, match="did not return"):
        read_reply(read_end, 0.5)
    assert stuck.wait(timeout=10) == -signal.SIGKILL
    os.close(write_end)


def test_the_launcher_is_started_again_after_it_died():
    import os
    import signal

    from rlax_core.sandbox.run import launcher_process

    assert run_sandboxed({"a.py": "print('first')"}, ["a.py"], LIMITS).stdout == "first\n"
    server = launcher_process()
    os.kill(server.pid, signal.SIGKILL)
    server.wait(timeout=10)
    assert run_sandboxed({"a.py": "print('again')"}, ["a.py"], LIMITS).stdout == "again\n"
