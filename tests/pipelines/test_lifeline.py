"""A launcher owns its jobs: they die with it however it dies, and a run folder is held while any of them lives.

Real processes throughout: an owner that starts a job with ``pipelines.lifeline.spawn`` (the job holds
the lease as ``pipelines.cli`` does, and starts a child of its own), killed with SIGKILL.
"""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from rlax_core.config import ConfigError
from pipelines import run_folder
from pipelines.run_folder import LOCK_NAME, claim, release
from tests.support.processes import has_exited

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# The job: holds the lease first thing (as pipelines.cli.main does), starts a grandchild, prints both pids.
JOB = """
from pipelines import lifeline
held = lifeline.hold()
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(f"job {held} {child.pid}", flush=True)
time.sleep(300)
"""

# The owner: claims a run folder, starts the job holding the lease and the folder's lock, prints the job's pid.
OWNER = """
import subprocess, sys, time
from pipelines import lifeline
from pipelines.run_folder import claim, held_fds
claim(sys.argv[1], resume=True)
job = lifeline.spawn([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, pass_fds=held_fds())
print(job.pid, job.stdout.readline().decode().strip(), flush=True)
time.sleep(300)
"""


def _gone(pids, timeout_s=20.0) -> list[int]:
    """The pids still alive (zombies count as gone once all their threads are) after up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if not has_exited(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture
def owner(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "run"), JOB], env=ENV,
                               stdout=subprocess.PIPE, text=True)
    try:
        job_pid, word, held, grandchild_pid = process.stdout.readline().split()
        assert word == "job" and held == "True", "the job found no lease to hold"
        yield process, int(job_pid), int(grandchild_pid)
    finally:
        process.kill()
        process.wait(timeout=30)


def test_a_sigkilled_owner_takes_its_job_and_the_job_s_children_with_it(owner):
    process, job, grandchild = owner
    assert _gone([job, grandchild], timeout_s=0) == [job, grandchild]  # alive while the owner lives
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert _gone([job, grandchild]) == []


def test_a_live_run_folder_is_refused_with_its_owner_named_and_taken_over_once_it_is_gone(owner, tmp_path, caplog):
    process, job, _ = owner
    folder = tmp_path / "run"
    for resume in (True, False):
        with pytest.raises(ConfigError, match=rf"in use by a live run: pid {process.pid} on host "
                                              rf"{socket.gethostname()}"):
            claim(folder, resume=resume)
    os.kill(job, signal.SIGKILL)  # the job alone dies: the owner still holds the folder
    assert _gone([job]) == []
    with pytest.raises(ConfigError, match=f"pid {process.pid}"):
        claim(folder, resume=True)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    with caplog.at_level(logging.WARNING, logger="pipelines.run_folder"):
        assert claim(folder, resume=True) is False  # only the lock file was there
    assert f"from pid {process.pid} on host" in caplog.text and "no longer running" in caplog.text
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    release(folder)


def _owner_with_an_unleashed_job(tmp_path) -> tuple[subprocess.Popen, int]:
    """An owner whose job does not hold the lease (started by hand), so it outlives the owner."""
    unleashed = JOB.replace("held = lifeline.hold()", "held = True")
    process = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "run"), unleashed], env=ENV,
                               stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline().split()[0])


def test_the_folder_stays_held_while_a_job_outlives_its_owner(tmp_path, monkeypatch):
    """A job that outlives its owner keeps the run's lock past the grace: no second trainer beside it."""
    monkeypatch.setattr(run_folder, "DYING_JOBS_GRACE_S", 0.5)
    process, job = _owner_with_an_unleashed_job(tmp_path)
    try:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        with pytest.raises(ConfigError, match=f"in use by a live run: pid {process.pid} .*has exited, but a "
                                              "process it started still holds the folder"):
            claim(tmp_path / "run", resume=True)
    finally:
        os.killpg(job, signal.SIGKILL)
    assert _gone([job]) == []
    assert claim(tmp_path / "run", resume=True) is False
    release(tmp_path / "run")


def test_a_restart_right_after_the_owner_died_waits_for_its_dying_jobs(tmp_path, caplog):
    """A supervisor relaunching a killed run at once: the old jobs still hold the lock for a moment."""
    process, job = _owner_with_an_unleashed_job(tmp_path)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    threading.Timer(1.0, os.killpg, (job, signal.SIGKILL)).start()  # dies late, as a job slow to its lease would
    with caplog.at_level(logging.WARNING, logger="pipelines.run_folder"):
        assert claim(tmp_path / "run", resume=True) is False
    assert has_exited(job) and f"from pid {process.pid} on host" in caplog.text
    release(tmp_path / "run")


def test_resume_on_a_live_folder_is_refused_before_the_heavy_imports(owner, tmp_path):
    from tests.pipelines.test_run_folder import rlax_light

    process, _, _ = owner
    done = rlax_light("launch", "--resume", "--output", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rlax launch: config error: --output: ") and f"pid {process.pid}" in line, line
    assert "imported before" not in done.stderr


def test_a_lease_variable_without_its_fd_is_ignored(monkeypatch):
    from pipelines import lifeline

    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    monkeypatch.setenv(lifeline.LEASE_ENV, str(read_end))
    assert lifeline.hold() is False and lifeline.LEASE_ENV not in os.environ


def test_a_forked_helper_of_the_owner_does_not_keep_the_lease_alive(tmp_path):
    """The owner forks a helper (as a multiprocessing pool does) that outlives it: the job still dies."""
    forking_owner = OWNER.replace("print(job.pid", "import os\nhelper = os.fork()\nif helper == 0:\n"
                                                   "    time.sleep(300)\n    os._exit(0)\nprint(job.pid")
    process = subprocess.Popen([sys.executable, "-c", forking_owner, str(tmp_path / "run"), JOB], env=ENV,
                               stdout=subprocess.PIPE, text=True)
    job, _, _, grandchild = process.stdout.readline().split()
    helper = [child.pid for child in psutil.Process(process.pid).children() if child.pid != int(job)]
    assert len(helper) == 1
    try:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert _gone([int(job), int(grandchild)]) == []
    finally:
        for pid in helper:
            os.kill(pid, signal.SIGKILL)
