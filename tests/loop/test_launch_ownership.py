"""`rlax launch` owns its jobs: SIGKILL it mid-run and no process of the run is left; while it runs,
`--resume` on its folder is refused with the owner named; once it is gone, the folder is taken over."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipelines.run_folder import claim, release
from pipelines.runners import cached_prism_binary
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.support.processes import has_exited
from tests.support.tiny_launch import tiny_launch_overrides

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = tiny_launch_overrides(steps=50)


def _rlax(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", *argv], cwd=REPO, **kwargs)


def _run_tree(launch: psutil.Process) -> list[psutil.Process]:
    """The launch's jobs and everything they started (each job leads its own session)."""
    try:
        return launch.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_a_sigkilled_launch_leaves_no_live_job_and_a_live_one_refuses_resume(tmp_path):
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 8), train_set)
    output = tmp_path / "run"
    launch = _rlax("launch", "--config", "quickstart", "--train-set", str(train_set), "--output", str(output),
                   *OVERRIDES, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tree: list[psutil.Process] = []
    try:
        # Both jobs started, and the rollout job's own children (its Prism) too.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and launch.poll() is None:
            tree = _run_tree(psutil.Process(launch.pid))
            if len(tree) >= 3 and (output / "logs" / "rollout.log").exists():
                break
            time.sleep(1)
        assert len(tree) >= 3, f"the launch did not start its jobs: {[p.cmdline()[:4] for p in tree]}"

        resumed = _rlax("launch", "--resume", "--output", str(output), "--train-set", str(train_set),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, error = resumed.communicate(timeout=120)
        assert resumed.returncode == 2, error[-2000:]
        assert f"in use by a live run: pid {launch.pid} on host {socket.gethostname()} (rlax launch" in error, error

        tree = _run_tree(psutil.Process(launch.pid))  # what is alive just before the kill
        launch.send_signal(signal.SIGKILL)
        launch.wait(timeout=30)
        deadline = time.monotonic() + 30
        alive = tree
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if not has_exited(p.pid)]
            time.sleep(0.5)
        assert alive == [], f"left running after the launch was killed: {[p.cmdline()[:4] for p in alive]}"
        assert claim(output, resume=True) is True  # a dead owner's lock is taken over
        release(output)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait(timeout=30)
        for process in tree:  # what a failed assertion left behind
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


def test_a_launch_whose_weights_fill_their_disk_names_enospc_the_path_and_the_job_first(tmp_path):
    """The weight store on a 64 KiB tmpfs (a mount namespace of the test's own): the trainer's first
    publish fills it; the launch's one line names the job, ENOSPC and the path, not "exited with code 1"."""
    from tests.support.namespaces import can_mount_a_tmpfs

    if not can_mount_a_tmpfs():
        pytest.skip("no user namespaces here to mount a tiny tmpfs in")
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 8), train_set)
    full = tmp_path / "full"
    full.mkdir()
    launch = (f"{sys.executable} -m pipelines.cli launch --config quickstart --train-set {train_set} "
              f"--output {tmp_path / 'run'} weights.root={full}/weights weights.run_id=quickstart --timeout-s 600 " + " ".join(OVERRIDES))
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {full} && exec {launch}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 2, done.stderr[-3000:]
    line = [line for line in done.stderr.splitlines() if line.startswith("rlax launch: ")][-1]
    assert line.startswith("rlax launch: resource error: the trainer job (pid "), line
    assert "no space left on device (ENOSPC)" in line and f"{full}/weights" in line and "in rlax train (pid" in line, line
