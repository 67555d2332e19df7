"""``rlax train`` as a process: exact resume after SIGKILL, SIGTERM as a preemption notice."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlax_core.data.rollout_store import RolloutStore
from rlax_core.models import Model, init_params, save_pretrained, toy_config
from rlax_core.training.checkpoint import Checkpointer
from rlax_core.utils.metrics import read_metrics

from training_helpers import write_random_groups

REPO = Path(__file__).resolve().parents[2]
GROUPS_PER_STEP = 2


# PPO: a critic with its own Adam state, the KL in the reward, 2 epochs x 2 mini-batches per batch.
PPO = ({"preset": "ppo"}, {"ppo_epochs": 2, "mini_batches": 2, "value_model": {"optimizer": {"learning_rate": 1e-3}}})
# LoRA with a KL to the base: adapters and their Adam moments in the checkpoint, adapter-only versions.
LORA = ({"preset": "grpo", "kl_coef": 0.01}, {"lora": {"rank": 4, "alpha": 8.0}})


def make_run(tmp_path: Path, name: str, model_dir: Path, algorithm=None, trainer=None) -> Path:
    config = {
        "run": {"name": "job", "output_dir": str(tmp_path / name)},
        "model": {"path": str(model_dir)},
        "algorithm": algorithm or {"preset": "grpo"},
        "trainer": {"groups_per_step": GROUPS_PER_STEP, "max_seq_len": 16, "total_steps": 6, "checkpoint_every": 1,
                    "poll_s": 0.1, "wait_timeout_s": 300, "mesh": {"fsdp": 1},
                    "optimizer": {"learning_rate": 1e-3, "warmup_steps": 2, "schedule": "cosine", "decay_steps": 10},
                    **(trainer or {})},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import jax

    # stories260K's 512-piece tokenizer over a toy model of that vocabulary: the job exports complete folders.
    config = toy_config(vocab_size=512)
    folder = tmp_path_factory.mktemp("toy_model")
    save_pretrained(Model(config, init_params(config, jax.random.key(0))), folder)
    shutil.copyfile(REPO / "pipelines/assets/stories260K/tok512.model", folder / "tok512.model")
    return folder


def start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)], cwd=REPO,
                            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    assert process.wait(timeout) == 0, log.read_text()[-3000:]


def wait_for_checkpoint(directory: Path, step: int, process: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    checkpointer = Checkpointer(directory, async_save=False)
    while (checkpointer.latest_step() or -1) < step:
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint {step} after {timeout} s"
        time.sleep(0.2)


def load_final(output: Path):
    import jax

    checkpointer = Checkpointer(output / "checkpoints", async_save=False)
    step = checkpointer.latest_step()
    state, ledger = checkpointer.restore(step)
    return step, jax.tree.map(np.asarray, state), ledger.to_json()


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, trainer", [(None, None), PPO, LORA], ids=["grpo", "ppo-value-model", "lora"])
def test_sigkill_and_restart_resumes_bit_identically(tmp_path, model_dir, algorithm, trainer):
    # Uninterrupted: every group is there from the start.
    config = make_run(tmp_path, "straight", model_dir, algorithm, trainer)
    write_random_groups(RolloutStore(tmp_path / "straight" / "rollouts", "job"), range(6), groups_per_step=GROUPS_PER_STEP)
    finish(start(config, tmp_path / "straight.log"), tmp_path / "straight.log")

    # Interrupted: 3 steps of groups, SIGKILL once step 3 is checkpointed, then the rest and a restart.
    config = make_run(tmp_path, "killed", model_dir, algorithm, trainer)
    store = RolloutStore(tmp_path / "killed" / "rollouts", "job")
    write_random_groups(store, range(3), groups_per_step=GROUPS_PER_STEP)
    first = start(config, tmp_path / "killed-1.log")
    wait_for_checkpoint(tmp_path / "killed" / "checkpoints", 3, first, tmp_path / "killed-1.log")
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    write_random_groups(store, range(3, 6), groups_per_step=GROUPS_PER_STEP)
    finish(start(config, tmp_path / "killed-2.log"), tmp_path / "killed-2.log")
    assert "resumed from checkpoint 3" in (tmp_path / "killed-2.log").read_text()

    step_a, state_a, ledger_a = load_final(tmp_path / "straight")
    step_b, state_b, ledger_b = load_final(tmp_path / "killed")
    assert step_a == step_b == 6
    leaves_a, leaves_b = jax_leaves(state_a), jax_leaves(state_b)
    assert len(leaves_a) == len(leaves_b) > 10
    if trainer is PPO[1]:  # the critic and its Adam moments are in the checkpoint too
        assert any("value_opt_state" in path for path, _ in leaves_a)
    if trainer is LORA[1]:  # adapters only: no base kernel in the checkpoint
        assert all("lora_" in path for path, _ in leaves_a if "params" in path and "opt_state" not in path)
    for (path, a), (_, b) in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(a, b, err_msg=path)  # params, Adam moments, counts, step, RNG: bit for bit
    assert ledger_a == ledger_b
    expected = [[step, index] for step in range(6) for index in range(GROUPS_PER_STEP)]
    assert ledger_a["consumed"] == expected and ledger_a["dropped"] == []  # none twice, none skipped

    # Weight versions 0..6 were published; metrics were written by both lives of the killed run.
    committed = sorted(int(p.stem.split("_")[1]) for p in (tmp_path / "killed" / "weights" / "committed").glob("*.json"))
    assert committed[-1] == 6
    steps = [row["step"] for row in read_metrics(tmp_path / "killed" / "metrics")]
    assert steps[-3:] == [4, 5, 6] and "train/loss" in read_metrics(tmp_path / "killed" / "metrics")[-1]
    if trainer is LORA[1]:  # version 0 is the base in full; every later one is adapters pinned to it
        import json

        manifests = {v: json.loads((tmp_path / "killed" / "weights" / f"step_{v:08d}" / "manifest.json").read_text())
                     for v in (0, 6)}
        assert manifests[0].get("adapter") is None and manifests[6]["adapter"]["base_version"] == 0
        assert all("lora_" in t["name"] for t in manifests[6]["tensors"])
        assert (tmp_path / "killed" / "hf" / "step_00000006" / "adapter" / "adapter_config.json").is_file()


def jax_leaves(tree):
    import jax

    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_zero(tmp_path, model_dir):
    config = make_run(tmp_path, "preempted", model_dir)
    write_random_groups(RolloutStore(tmp_path / "preempted" / "rollouts", "job"), range(2), groups_per_step=GROUPS_PER_STEP)
    process = start(config, tmp_path / "preempted.log")
    wait_for_checkpoint(tmp_path / "preempted" / "checkpoints", 2, process, tmp_path / "preempted.log")
    process.send_signal(signal.SIGTERM)  # it is waiting for step 3's groups
    finish(process, tmp_path / "preempted.log", timeout=120)
    assert "received SIGTERM" in (tmp_path / "preempted.log").read_text()
    assert Checkpointer(tmp_path / "preempted" / "checkpoints").latest_step() == 2


@pytest.mark.slow  # two trainer lives in-process: ~30 s on an idle 2-core machine
def test_a_resumed_run_writes_each_step_once_in_metrics(tmp_path):
    # A job writes a step's metrics when the step is done; if it dies before that step's checkpoint
    # is durable, the next life trains the step again. Its row must then replace the old one.
    import shutil

    import jax

    from rlax_core.config import from_dict
    from rlax_core.rl.presets import get_preset
    from rlax_core.training.config import TrainerConfig
    from rlax_core.training.job import run_training

    model_config = toy_config()
    params = init_params(model_config, jax.random.key(0))
    config = from_dict(TrainerConfig, {"groups_per_step": 1, "max_seq_len": 16, "total_steps": 3,
                                       "checkpoint_every": 2, "async_checkpointing": False, "poll_s": 0.05,
                                       "wait_timeout_s": 60, "mesh": {"fsdp": -1}})
    store = RolloutStore(tmp_path / "rollouts", "job")
    write_random_groups(store, range(3), groups_per_step=1)

    def life():
        return run_training(model_config=model_config, initial_params=params, algorithm=get_preset("grpo"),
                            config=config, store=store, weights=None, checkpoint_dir=str(tmp_path / "checkpoints"),
                            metrics_dir=str(tmp_path / "metrics"))

    assert life().step == 3
    shutil.rmtree(tmp_path / "checkpoints" / "3")  # the last checkpoint never became durable
    result = life()
    assert (result.resumed_from, result.step) == (2, 3)
    assert [row["step"] for row in read_metrics(tmp_path / "metrics")] == [1, 2, 3]


@pytest.mark.slow  # a 4-step run and one resumed step, in-process: ~30 s on an idle 2-core machine
def test_a_corrupt_newest_checkpoint_is_skipped_and_the_resumed_run_ends_bit_identical(tmp_path, caplog):
    # Checkpoint 4 is damaged on disk after the run: the next start must skip it (saying so), resume
    # from 3 with 3's ledger, train step 4 again from the same rollout groups and end where the run
    # that was never damaged ended, bit for bit.
    import jax

    from rlax_core.config import from_dict
    from rlax_core.rl.presets import get_preset
    from rlax_core.training.config import TrainerConfig
    from rlax_core.training.job import run_training

    model_config = toy_config()
    params = init_params(model_config, jax.random.key(0))
    config = from_dict(TrainerConfig, {"groups_per_step": 2, "max_seq_len": 16, "total_steps": 4,
                                       "checkpoint_every": 1, "keep_checkpoints": 2, "async_checkpointing": True,
                                       "poll_s": 0.05, "wait_timeout_s": 60, "mesh": {"fsdp": -1},
                                       "optimizer": {"learning_rate": 1e-3, "warmup_steps": 1}})
    store = RolloutStore(tmp_path / "rollouts", "job")
    write_random_groups(store, range(4), groups_per_step=2)
    checkpoints = tmp_path / "checkpoints"

    def life():
        return run_training(model_config=model_config, initial_params=params, algorithm=get_preset("grpo"),
                            config=config, store=store, weights=None, checkpoint_dir=str(checkpoints),
                            metrics_dir=str(tmp_path / "metrics"))

    def final():
        state, ledger = Checkpointer(checkpoints).restore(4)
        return jax_leaves(jax.tree.map(np.asarray, state)), ledger.to_json()

    assert life().step == 4
    uninterrupted, uninterrupted_ledger = final()
    data = max((checkpoints / "4" / "state").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0x10
    data.write_bytes(bytes(damaged))

    with caplog.at_level("WARNING", logger="rlax_core.training.checkpoint"):
        result = life()
    assert (result.resumed_from, result.step) == (3, 4)
    assert f"checkpoint {checkpoints}/4 is skipped: state/" in caplog.text and "differs from its SHA-256" in caplog.text
    assert (checkpoints / "refused" / "4").is_dir()
    resumed, resumed_ledger = final()
    assert resumed_ledger == uninterrupted_ledger
    assert len(resumed) == len(uninterrupted) > 10
    for (path, a), (_, b) in zip(uninterrupted, resumed):
        np.testing.assert_array_equal(a, b, err_msg=path)  # params, Adam moments, step, RNG: bit for bit
    assert [row["step"] for row in read_metrics(tmp_path / "metrics")] == [1, 2, 3, 4]
    assert Checkpointer(checkpoints).all_steps() == [3, 4]


@pytest.mark.slow
def test_rlax_train_with_no_good_checkpoint_left_fails_in_one_line(tmp_path, model_dir):
    config = make_run(tmp_path, "ruined", model_dir, trainer={"total_steps": 2})
    write_random_groups(RolloutStore(tmp_path / "ruined" / "rollouts", "job"), range(2), groups_per_step=GROUPS_PER_STEP)
    finish(start(config, tmp_path / "ruined-1.log"), tmp_path / "ruined-1.log")
    checkpoints = tmp_path / "ruined" / "checkpoints"
    for step in Checkpointer(checkpoints).all_steps():
        (checkpoints / str(step) / "ledger" / "metadata").write_text('{"consumed": [], "dropped": []}')
    process = start(config, tmp_path / "ruined-2.log")
    assert process.wait(600) == 2
    lines = (tmp_path / "ruined-2.log").read_text().splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert re.fullmatch(rf"rlax train: input error: no good checkpoint in {re.escape(str(checkpoints))} "
                        r"\(2: ledger/metadata holds 31 bytes, \d+ when sealed; 1: ledger/metadata holds 31 bytes, "
                        r"\d+ when sealed\); to start fresh, move that folder away or give the run another "
                        r"run.output_dir", lines[-1]), lines[-1]


def test_a_batch_padded_to_over_twice_its_rows_is_warned_about_once(caplog):
    from types import SimpleNamespace

    from rlax_core.training.job import _warn_if_mostly_padding

    trainer = SimpleNamespace(batch_shards=2, row_multiple=32,
                              config=SimpleNamespace(mini_batches=1, micro_batches=16))
    full = {"sample_mask": np.ones(32, np.float32)}
    padded = {"sample_mask": np.concatenate([np.ones(4, np.float32), np.zeros(28, np.float32)])}
    with caplog.at_level("WARNING", logger="rlax_core.training.job"):
        assert not _warn_if_mostly_padding(full, trainer)
        assert caplog.records == []
        assert _warn_if_mostly_padding(padded, trainer)
    assert "4 rows are padded to 32" in caplog.text and "trainer.micro_batches" in caplog.text


def test_a_failed_first_publication_stops_a_trainer_waiting_for_rollouts(tmp_path, monkeypatch):
    # Version 0 is written in the background while the trainer goes on to wait for rollouts made with
    # it. If that write fails (a full disk), no rollout will ever come: the wait must end with the
    # write's error, not run out its timeout.
    import errno

    import jax

    from rlax_core.config import from_dict
    from rlax_core.rl.presets import get_preset
    from rlax_core.training.config import TrainerConfig
    from rlax_core.training.job import run_training
    from rlax_core.utils.resources import resource_failure
    from rlax_core.weights.store import WeightStore, WeightStoreConfig

    weights = WeightStore(WeightStoreConfig(root=str(tmp_path / "weights"), run_id="full"))

    def disk_full(version, params, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "weights" / f"v{version}"))

    monkeypatch.setattr(weights, "publish", disk_full)
    model_config = toy_config()
    config = from_dict(TrainerConfig, {"groups_per_step": 1, "max_seq_len": 16, "total_steps": 2, "poll_s": 0.05,
                                       "wait_timeout_s": 30, "mesh": {"fsdp": -1}})
    with pytest.raises(RuntimeError, match="an earlier weight publication failed") as raised:
        run_training(model_config=model_config, initial_params=init_params(model_config, jax.random.key(0)),
                     algorithm=get_preset("grpo"), config=config, store=RolloutStore(tmp_path / "rollouts", "job"),
                     weights=weights, checkpoint_dir=str(tmp_path / "checkpoints"),
                     metrics_dir=str(tmp_path / "metrics"))
    assert "no space left on device (ENOSPC)" in resource_failure(raised.value, "rlax train")
    chain, todo = [], [raised.value]  # causes and contexts both: close() raising in a `finally` hides a timeout
    while todo:
        error = todo.pop()
        chain.append(type(error).__name__)
        todo.extend(e for e in (error.__cause__, error.__context__) if e is not None)
    assert "TimeoutError" not in chain, f"the wait ran out before the failed write was told: {chain}"
