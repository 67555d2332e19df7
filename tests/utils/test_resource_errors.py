"""A full disk names itself: ENOSPC, the path and the process, in one line, for a command and for a launcher's job.

The disk fills for real: the kernel's ``/dev/full`` (every write fails with ENOSPC), and a 4 KiB tmpfs
mounted in a user and mount namespace of the test's own (``unshare -Urm``: no root, nothing left behind).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.launch import start, start_command, wait_for_trainer
from rlax_core.utils.resources import ResourceError, resource_failure, resource_failure_in_log
from tests.support.namespaces import can_mount_a_tmpfs

REPO = Path(__file__).resolve().parents[2]
HELDOUT = str(REPO / "pipelines" / "assets" / "story_task" / "heldout.jsonl")


def _write_to_full_device():
    handle = open("/dev/full", "w")
    handle.write("x" * 100)
    handle.flush()


def test_a_wrapped_enospc_names_the_file_and_the_process():
    try:
        try:
            _write_to_full_device()
        except OSError as error:
            raise RuntimeError("the writer failed") from error  # as a library would wrap it
    except RuntimeError as wrapped:
        line = resource_failure(wrapped, "rlax test")
    assert line == f"no space left on device (ENOSPC) writing /dev/full, in rlax test (pid {os.getpid()})"
    assert resource_failure(RuntimeError("something else"), "rlax test") is None


def test_a_runner_s_text_is_read_and_a_job_s_line_read_back_from_its_log(tmp_path):
    try:
        _write_to_full_device()
    except OSError as error:
        text_only = RuntimeError(f"OSError: {error} [while running 'WriteExamples']")  # Beam keeps only the text
    line = resource_failure(text_only, "rlax curate", where=[str(tmp_path)])  # tmp_path's disk is not full
    assert line == f"no space left on device (ENOSPC), in rlax curate (pid {os.getpid()})"
    quoted = RuntimeError("OSError: [Errno 122] Disk quota exceeded: '/data/run/weights/x.bin'")
    assert resource_failure(quoted, "rlax train").startswith("disk quota exceeded (EDQUOT) writing /data/run/weights/x.bin")
    assert resource_failure_in_log(f"Traceback ...\nrlax train: resource error: {line}\n") == line
    assert resource_failure_in_log("OSError: [Errno 28] No space left on device: '/r/m.jsonl'\n") == (
        "no space left on device (ENOSPC) writing /r/m.jsonl")
    assert resource_failure_in_log("exited with code 1\n") is None


@pytest.mark.skipif(not can_mount_a_tmpfs(), reason="no user namespaces here to mount a tiny tmpfs in")
def test_a_command_on_a_full_file_system_says_enospc_and_the_output_in_one_line(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    script = (f"mount -t tmpfs -o size=4k tmpfs {full} && exec {sys.executable} -m pipelines.cli curate "
              f"--input {HELDOUT} --output {full}/curated")
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr[-3000:]
    line = next(line for line in done.stderr.splitlines() if line.startswith("rlax curate: "))
    assert line.startswith(f"rlax curate: resource error: no space left on device (ENOSPC) writing {full}/curated ("), line
    assert ", in rlax curate (pid " in line


def test_the_launcher_names_a_job_s_full_disk_first(tmp_path):
    """A real rlax job (`rlax generate`, writing its output to /dev/full) fails as a trainer would."""
    logs = tmp_path / "logs"
    job = start("trainer", ["generate", "--model", "assets:stories260K", "--prompt", "Once", "--max-new-tokens", "2",
                            "--output", "/dev/full"], logs)
    idle = start_command("rollout", [sys.executable, "-c", "import time; time.sleep(600)"], logs)
    try:
        with pytest.raises(ResourceError) as raised:
            wait_for_trainer(job, idle, total_steps=1, metrics_dir=str(tmp_path / "metrics"), timeout_s=600, poll_s=0.5)
    finally:
        job.stop(10)
        idle.stop(10)
    assert str(raised.value).startswith(
        f"the trainer job (pid {job.popen.pid}) failed: no space left on device (ENOSPC) writing /dev/full, in rlax "
        f"generate (pid {job.popen.pid}); its log: {logs / 'trainer.log'}"), str(raised.value)
