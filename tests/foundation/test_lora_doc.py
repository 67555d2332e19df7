"""Every command docs/lora.md writes runs in a test: as written where it takes seconds, sized down in
the slow lane where it takes minutes (``SIZED_DOWN``: only a smaller size or fewer steps, so the
command is still the one a reader types)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_commands import markdown_commands

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "lora.md"
# command start -> where it runs
RUN_BY = {
    "python benchmarks/adapter_serving.py": "tests/inference/test_adapter_serving_benchmark.py, as written",
    "rlax plan --config": "here, as written",
    "python benchmarks/weight_sync.py": "here, slow lane, sized down",
    "rlax quickstart": "here, slow lane, sized down",
}
SIZED_DOWN = {  # what the slow lane changes in a command: (written, run)
    "python benchmarks/weight_sync.py": ("--sizes 25m,500m", "--sizes 25m"),  # 500m: ~1 GB per version
    # As tests/foundation/test_readme.py shortens it, with a third step: with k = 1 the third step's
    # rollouts need version 1 or later, an adapter version, so the workers apply one.
    "rlax quickstart": ("", " --filter-prompts 16 trainer.total_steps=3"),
}


def _command(start: str) -> str:
    (command,) = [c for c in markdown_commands(DOC) if c.startswith(start)]
    return command


def _sized_down(command: str) -> str:
    start = next(s for s in SIZED_DOWN if command.startswith(s))
    written, run = SIZED_DOWN[start]
    return command.replace(written, run) if written else command + run


def _environment() -> dict[str, str]:
    """This checkout first on the path (an installed rlax may point at another); conftest's 8 devices dropped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", PYTHONPATH=str(REPO),
               XLA_FLAGS=env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "").strip())
    return env


def test_every_command_of_the_doc_is_run_by_a_test():
    commands = markdown_commands(DOC)
    assert len(commands) == len(RUN_BY)
    assert all(sum(c.startswith(start) for c in commands) == 1 for start in RUN_BY), commands
    for start, (written, _) in SIZED_DOWN.items():
        assert written in _command(start)


def test_the_lora_recipe_plans_as_written(capsys):
    from pipelines.cli import main

    words = shlex.split(_command("rlax plan --config"))
    assert main(words[1:]) == 0
    out = capsys.readouterr().out
    assert "trainer: QwQ-32B on 4 x v5p" in out and "adapter activations" in out and "does not fit" not in out


@pytest.mark.slow  # publishes a 25M model in full and as adapters: a minute on 2 cores
def test_the_weight_sync_command_measures_adapter_versions_against_full_ones(tmp_path):
    command = _sized_down(_command("python benchmarks/weight_sync.py"))
    done = subprocess.run(shlex.split(command), cwd=REPO, env=_environment(), capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    adapters = report["sizes"]["25m"]["adapters"]
    assert adapters["adapter"]["read_bytes_per_version"] == adapters["adapter"]["written_bytes_per_version"]
    assert adapters["adapter_bytes_over_full"] < 0.05  # rank 16 on a 25M model: 0.030 in docs/lora.md


@pytest.mark.slow  # the quickstart with LoRA, 2 RL steps: about 4 minutes on 2 cores
def test_the_lora_quickstart_command_runs_and_reports(tmp_path):
    command = _sized_down(_command("rlax quickstart"))
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=_environment(), capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    output = tmp_path / shlex.split(command)[shlex.split(command).index("--output") + 1]
    report = json.loads((output / "report.json").read_text())
    # Three LoRA steps published as adapter versions 1 to 3 on the base, version 0; a rollout worker's
    # engine took an adapter version through update_adapters (the follower's log), not merged weights.
    assert report["rl"]["steps"] == 3 and report["rl"]["final_weight_version"] == 3
    assert 0 <= report["after"]["pass@1"] <= 1 and report["before"]["pass@1"] >= 0
    worker_log = (output / "run" / "logs" / "rollout.log").read_text()
    assert "engine took adapter version" in worker_log and "on base version 0" in worker_log, worker_log[-3000:]
