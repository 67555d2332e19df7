"""Multi-host for real: two processes on localhost (jax.distributed, CPU collectives) take the same
train step as one process."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlax_core.data.rollout_store import RolloutStore

from training_helpers import write_random_groups

WORKER = Path(__file__).with_name("multihost_worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


WORKER_ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def run_workers(worker: Path, argvs: list[list[str]], logs: list[Path]) -> None:
    """One process per argv running ``worker``, each logging to its own file; all must exit 0."""
    env = {**os.environ, **WORKER_ENV, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    processes = [subprocess.Popen([sys.executable, str(worker), *argv], env=env, stdout=open(log, "w"),
                                  stderr=subprocess.STDOUT) for argv, log in zip(argvs, logs)]
    try:
        for process, log in zip(processes, logs):
            assert process.wait(600) == 0, log.read_text()[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def launch(store, out, num_processes, tmp_path):
    port = free_port()
    logs = [tmp_path / f"worker-{num_processes}-{i}.log" for i in range(num_processes)]
    run_workers(WORKER, [[str(store), str(out), str(num_processes), str(i), str(port)] for i in range(num_processes)],
                logs)
    return np.load(out)


@pytest.mark.slow
def test_two_processes_take_the_same_step_as_one(tmp_path):
    write_random_groups(RolloutStore(tmp_path / "store", "mh"), [0], groups_per_step=4, samples=4)
    one = launch(tmp_path / "store", tmp_path / "one.npz", 1, tmp_path)
    two = launch(tmp_path / "store", tmp_path / "two.npz", 2, tmp_path)
    assert int(one["devices"]) == 1 and int(two["devices"]) == 2 and bool(two["sharded"])
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5, atol=1e-7)
    names = [n for n in one.files if n.startswith("[")]
    assert len(names) > 10 and sorted(names) == sorted(n for n in two.files if n.startswith("["))
    for name in names:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_a_checkpoint_sharded_over_two_processes_is_sealed_verified_and_refused_alike(tmp_path):
    port = free_port()
    logs = [tmp_path / f"checkpoint-worker-{i}.log" for i in range(2)]
    run_workers(WORKER.with_name("multihost_checkpoint_worker.py"),
                [[str(tmp_path / "checkpoints"), "2", str(i), str(port)] for i in range(2)], logs)
    for log in logs:  # both refused the damaged shard, for the same reason
        refused = [line for line in log.read_text().splitlines() if line.startswith("refused: ")]
        assert len(refused) == 1 and "/3: state/ocdbt.process_1/" in refused[0], log.read_text()[-3000:]
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "3" / "state").iterdir() if "process" in p.name) == \
        ["ocdbt.process_0", "ocdbt.process_1"]  # each process wrote its own shards
