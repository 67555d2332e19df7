"""`rlax rollout` as a process: it ends by itself, its Prism dies with it, and it leaves no scratch behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.launch import start
from pipelines.rl_stream import load_configs
from pipelines.runners import cached_prism_binary, scratch_dir
from rlax_core.data.rollout_store import RolloutStore
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.support.processes import has_exited
from tests.support.tiny_launch import tiny_launch_overrides

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "quickstart.yaml")
needs_prism = pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")


def _children(pid: int, named: str = "prism") -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and named.encode() in (stat.parent / "cmdline").read_bytes():
            found.append(int(stat.parent.name))
    return found


def _wait(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def test_scratch_dir_removes_what_killed_processes_left_and_its_own():
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        leftover = Path(root) / f"rollout-{gone.pid}"
        (leftover / "prism").mkdir(parents=True)
        alive = Path(root) / f"rollout-{os.getppid()}"  # our parent is running: its folder stays
        alive.mkdir()
        with scratch_dir("rollout", Path(root)) as folder:
            assert folder == Path(root) / f"rollout-{os.getpid()}" and folder.is_dir()
            assert tempfile.gettempdir() == str(folder)
            assert not leftover.exists() and alive.exists()
        assert not folder.exists() and tempfile.gettempdir() != str(folder)


@needs_prism
def test_prism_dies_with_a_sigkilled_parent(tmp_path):
    # The parent owns a LocalPrism and says its pid; SIGKILL leaves it no chance to clean up.
    script = ("import sys, time\nfrom pathlib import Path\nfrom pipelines.runners import LocalPrism, "
              "cached_prism_binary\nwith LocalPrism(cached_prism_binary(), Path(sys.argv[1])) as prism:\n"
              "    print(prism.popen.pid, flush=True)\n    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        prism_pid = int(parent.stdout.readline())
        assert not has_exited(prism_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        _wait(lambda: has_exited(prism_pid), 30, f"Prism {prism_pid} outlived its SIGKILLed parent")
    finally:
        parent.kill()


def _overrides(tmp_path, total_steps):
    return tiny_launch_overrides(tmp_path / "run", steps=total_steps, max_staleness=1, max_seq_len=None,
                                 micro_batches=None, max_runtime_s=600, stall_polls=400)


def _rollout_argv(tmp_path, overrides):
    train_set = tmp_path / "train.jsonl"
    if not train_set.exists():
        write_jsonl(story_examples("train", 8), train_set)
    return ["rollout", "--config", CONFIG, "--train-set", str(train_set), *overrides]


def _publish_version_0(run_config):
    from rlax_core.models import from_pretrained
    from rlax_core.weights import WeightStore

    with WeightStore(run_config.weight_store()) as store:
        store.publish(0, from_pretrained(run_config.model.resolved_path()).params)


@pytest.mark.slow  # Prism, the engine's compilation, two schedule steps
@needs_prism
def test_rollout_ends_by_itself_once_every_step_is_generated(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    overrides = _overrides(tmp_path, total_steps=2)
    run_config, _ = load_configs(CONFIG, overrides)
    _publish_version_0(run_config)  # with k = 1, version 0 allows both steps: no trainer needed
    rollout = start("rollout", _rollout_argv(tmp_path, overrides), tmp_path / "logs")
    try:
        assert rollout.popen.wait(timeout=600) == 0, rollout.tail(40)
    finally:
        rollout.stop(5)
    store = RolloutStore(run_config.rollout_root(), run_config.run.name)
    assert [(k.step, k.prompt_index) for k in store.list_groups()] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "all 2 steps generated" in rollout.log_path.read_text()
    assert list((tmp_path / "tmp" / "rlax-scratch").iterdir()) == []  # its scratch folder went with it


@pytest.mark.slow  # two rollout processes start (imports, Prism, job submission)
@needs_prism
def test_a_sigkilled_rollout_takes_its_prism_along_and_its_restart_leaves_no_scratch(tmp_path, monkeypatch):
    # Nothing is published: the stream idles, which is all this needs (no engine work, no stall).
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    scratch = tmp_path / "tmp" / "rlax-scratch"
    scratch.mkdir(parents=True)
    argv = _rollout_argv(tmp_path, _overrides(tmp_path, total_steps=2))
    first = start("rollout", argv, tmp_path / "logs")
    second = None
    try:
        _wait(lambda: _children(first.popen.pid), 120, "rollout started no Prism")
        prism_pid = _children(first.popen.pid)[0]
        _wait(lambda: (scratch / f"rollout-{first.popen.pid}").is_dir(), 60, "no scratch folder")
        first.popen.send_signal(signal.SIGKILL)  # the process only, not its group: nobody else cleans up
        first.popen.wait(timeout=30)
        _wait(lambda: has_exited(prism_pid), 30, f"Prism {prism_pid} outlived the SIGKILLed rollout")
        assert (scratch / f"rollout-{first.popen.pid}").is_dir()  # what a killed process leaves...
        second = start("rollout2", argv, tmp_path / "logs")
        _wait(lambda: (scratch / f"rollout-{second.popen.pid}").is_dir(), 60, "restart made no scratch folder")
        assert not (scratch / f"rollout-{first.popen.pid}").exists()  # ...its restart removes
        second_prism = _children(second.popen.pid)
        second.popen.send_signal(signal.SIGTERM)  # a stop cleans up after itself
        assert second.popen.wait(timeout=60) == 128 + signal.SIGTERM, second.tail(30)
        assert list(scratch.iterdir()) == []
        assert all(has_exited(pid) for pid in second_prism)
    finally:
        for process in (first, second):
            if process is not None:
                process.stop(5)
