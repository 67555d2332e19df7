import fnmatch
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlax_core.data.rollout_store import GroupKey
from rlax_core.models.checkpoint import CheckpointError
from rlax_core.training import checkpoint_integrity
from rlax_core.training.checkpoint import Checkpointer, abstract_like
from rlax_core.training.checkpoint_integrity import SEAL_NAME, CheckpointCorrupt, Seal, inventory
from rlax_core.training.ledger import DataLedger
from rlax_core.utils.storage import open_storage


def test_state_and_ledger_round_trip_and_keep_n(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt", keep=2, async_save=True)
    assert checkpointer.latest_step() is None
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "step": jnp.int32(0),
             "rng": jax.random.key_data(jax.random.key(3))}
    for step in (1, 2, 3):
        state = {**state, "params": {"w": state["params"]["w"] + 1}, "step": jnp.int32(step)}
        checkpointer.save(step, state, DataLedger(consumed=[GroupKey(s, 0) for s in range(step)],
                                                  dropped=[GroupKey(0, 9)]))
    checkpointer.wait()
    assert checkpointer.latest_step() == 3
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == [2, 3]
    restored, ledger = Checkpointer(tmp_path / "ckpt").restore(3, abstract_like(state))
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    assert int(restored["step"]) == 3 and restored["rng"].dtype == jnp.uint32
    assert ledger.consumed == [GroupKey(0, 0), GroupKey(1, 0), GroupKey(2, 0)]
    assert ledger.dropped == [GroupKey(0, 9)]
    assert ledger.pending([GroupKey(3, 0), GroupKey(0, 9), GroupKey(2, 1)]) == [GroupKey(2, 1), GroupKey(3, 0)]
    checkpointer.close()


def small_state(seed: int = 0, rows: int = 64):
    key = jax.random.key(seed)
    return {"params": {"w": jax.random.normal(key, (rows, 32)), "b": jnp.ones(32, jnp.bfloat16)},
            "opt_state": {"mu": jnp.zeros((rows, 32)), "count": jnp.int32(7)},
            "step": jnp.int32(1), "rng": jax.random.key_data(key)}


def save(directory, steps=(1,), keep=3, **state_kwargs):
    checkpointer = Checkpointer(directory, keep=keep, async_save=False)
    for step in steps:
        checkpointer.save(step, {**small_state(**state_kwargs), "step": jnp.int32(step)},
                          DataLedger(consumed=[GroupKey(s, 0) for s in range(step)]))
    checkpointer.close()


def flip(path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << (position % 8)
    path.write_bytes(bytes(data))


# Every file a checkpoint holds, by the name orbax (or the seal) gives it; `*` stands for the hex names
# of OCDBT's data and index files. test_the_patterns_name_every_file_of_a_checkpoint keeps this whole.
CHECKPOINT_FILES = [
    SEAL_NAME, "_CHECKPOINT_METADATA", "commit_success.txt",
    "ledger/metadata", "ledger/commit_success.txt",
    "state/_METADATA", "state/_sharding", "state/array_metadatas/process_0", "state/commit_success.txt",
    "state/manifest.ocdbt", "state/d/*", "state/ocdbt.process_0/manifest.ocdbt", "state/ocdbt.process_0/d/*",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sealed") / "ckpt"
    save(directory)
    return directory


def test_the_patterns_name_every_file_of_a_checkpoint(saved):
    files = sorted(open_storage(str(saved / "1")).files(""))
    unnamed = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in CHECKPOINT_FILES)]
    assert not unnamed, f"files of a checkpoint no test flips bits in: {unnamed}"
    unused = [p for p in CHECKPOINT_FILES if not any(fnmatch.fnmatch(f, p) for f in files)]
    assert not unused


@pytest.mark.parametrize("pattern", CHECKPOINT_FILES)
def test_a_flipped_bit_anywhere_in_any_file_is_detected_at_restore(saved, tmp_path, pattern):
    files = [f for f in open_storage(str(saved / "1")).files("") if fnmatch.fnmatch(f, pattern)]
    assert files
    target = abstract_like(small_state())
    for name in files:
        size = (saved / "1" / name).stat().st_size
        for position in sorted({0, size // 3, size // 2, size - 1}):
            copy = tmp_path / f"copy-{position}"
            shutil.copytree(saved, copy)
            flip(copy / "1" / name, position)
            with pytest.raises(CheckpointCorrupt, match=f"{copy}/1: "):
                Checkpointer(copy).restore(1, target)
            shutil.rmtree(copy)
    Checkpointer(saved).restore(1, target)  # the original is untouched and restores


def test_array_data_too_big_to_digest_whole_is_checked_through_its_values(tmp_path, monkeypatch):
    # Files over SMALL_FILE_BYTES are only measured; a bit flipped in the values they hold must still
    # be caught (by the array digests, or by the decoder when it breaks a compressed block).
    monkeypatch.setattr(checkpoint_integrity, "SMALL_FILE_BYTES", 8192)
    save(tmp_path / "ckpt", rows=512)
    folder = tmp_path / "ckpt" / "1"
    seal = json.loads((folder / SEAL_NAME).read_text())
    big = [name for name, entry in seal["files"].items() if "sha256" not in entry]
    assert big and all(name.startswith("state/ocdbt.process_0/d/") for name in big)
    data_file = max(big, key=lambda name: seal["files"][name]["bytes"])
    size = seal["files"][data_file]["bytes"]
    outcomes = set()
    for position in range(size // 10, size * 8 // 10, size // 10):
        copy = tmp_path / "copy"
        shutil.copytree(tmp_path / "ckpt", copy)
        flip(copy / "1" / data_file, position)
        with pytest.raises(CheckpointCorrupt) as raised:
            Checkpointer(copy).restore(1, abstract_like(small_state(rows=512)))
        outcomes.add("digest" if "differs from its digest" in str(raised.value) else "unreadable")
        shutil.rmtree(copy)
    assert "digest" in outcomes


def test_a_value_changed_before_the_files_were_sealed_is_caught_by_its_array_digest(tmp_path):
    # A corruption that happened before the seal's file digests were taken (memory, the wire, a bad
    # disk between write and seal): the files agree with the seal, the values do not.
    save(tmp_path / "ckpt", rows=512)
    folder = tmp_path / "ckpt" / "1"
    storage = open_storage(str(tmp_path / "ckpt"))
    seal = Seal.from_bytes((folder / SEAL_NAME).read_bytes(), "test")
    data_file = max(seal.files, key=lambda name: seal.files[name]["bytes"])
    flip(folder / data_file, seal.files[data_file]["bytes"] // 2)
    resealed = Seal(seal.step, seal.arrays, seal.ledger, inventory(storage, "1"))
    (folder / SEAL_NAME).write_bytes(resealed.to_bytes())
    with pytest.raises(CheckpointCorrupt, match=r"array (params/w|opt_state/mu)"):
        Checkpointer(tmp_path / "ckpt").restore(1, abstract_like(small_state(rows=512)))


def test_array_digests_do_not_depend_on_how_the_arrays_are_sharded(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    state = jax.device_put(small_state(), NamedSharding(mesh, P()))
    state["params"]["w"] = jax.device_put(state["params"]["w"], NamedSharding(mesh, P("a", "b")))
    checkpointer = Checkpointer(tmp_path / "ckpt", async_save=False)
    checkpointer.save(1, state, DataLedger())
    checkpointer.close()
    one_device = abstract_like(jax.device_put(small_state(), jax.devices()[0]))
    restored, _ = Checkpointer(tmp_path / "ckpt").restore(1, one_device)  # verified on another layout
    np.testing.assert_array_equal(restored["params"]["w"], small_state()["params"]["w"])
    inspected, _ = Checkpointer(tmp_path / "ckpt").restore(1)  # and without a target, as saved
    np.testing.assert_array_equal(inspected["opt_state"]["mu"], 0)


def test_a_restore_in_another_dtype_is_verified_as_saved_then_cast(tmp_path):
    save(tmp_path / "ckpt")
    target = abstract_like(jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x,
                                        small_state()))
    restored, _ = Checkpointer(tmp_path / "ckpt").restore(1, target)
    assert restored["params"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(restored["params"]["w"], small_state()["params"]["w"].astype(jnp.bfloat16))


def test_a_state_of_another_shape_is_a_config_error_not_a_corrupt_checkpoint(tmp_path):
    save(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"(params/w|opt_state/mu) has shape \(64, 32\), this trainer's \(8, 32\)") as raised:
        Checkpointer(tmp_path / "ckpt").restore(1, abstract_like(small_state(rows=8)))
    assert not isinstance(raised.value, CheckpointCorrupt)


def test_the_newest_good_checkpoint_is_resumed_and_the_corrupt_ones_set_aside(tmp_path, caplog):
    save(tmp_path / "ckpt", steps=(1, 2, 3, 4), keep=3)
    flip(tmp_path / "ckpt" / "4" / "state" / "_METADATA", 10)
    (tmp_path / "ckpt" / "3" / SEAL_NAME).unlink()  # killed between orbax's commit and the seal
    checkpointer = Checkpointer(tmp_path / "ckpt", keep=1, async_save=False)
    with caplog.at_level(logging.WARNING, logger="rlax_core.training.checkpoint"):
        step, state, ledger = checkpointer.restore_newest(abstract_like(small_state()))
    assert step == 2 and int(state["step"]) == 2 and len(ledger.consumed) == 2
    assert f"checkpoint {tmp_path / 'ckpt'}/4 is skipped: state/_METADATA differs from its SHA-256" in caplog.text
    assert f"checkpoint {tmp_path / 'ckpt'}/3 is skipped: not sealed" in caplog.text
    assert sorted(os.listdir(tmp_path / "ckpt" / "refused")) == ["3", "4"]
    # The run writes steps 3 and 4 again; with keep=1, collection never removes the last good one.
    checkpointer.save(3, {**small_state(), "step": jnp.int32(3)}, DataLedger())
    assert checkpointer.all_steps() == [3]
    checkpointer.close()


def test_with_no_good_checkpoint_left_resuming_fails_in_one_line(tmp_path):
    save(tmp_path / "ckpt", steps=(1, 2))
    for step in (1, 2):
        flip(tmp_path / "ckpt" / str(step) / "ledger" / "metadata", 3)
    with pytest.raises(CheckpointError) as raised:
        Checkpointer(tmp_path / "ckpt").restore_newest(abstract_like(small_state()))
    message = str(raised.value)
    assert "\n" not in message and not isinstance(raised.value, CheckpointCorrupt)
    assert message.startswith(f"no good checkpoint in {tmp_path / 'ckpt'} (2: ledger/metadata differs")
    assert "1: ledger/metadata differs" in message and "to start fresh" in message
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1", "2"]  # nothing moved: the user decides


def test_a_fresh_folder_has_nothing_to_resume(tmp_path):
    assert Checkpointer(tmp_path / "ckpt").restore_newest(abstract_like(small_state())) is None


def test_the_integrity_benchmark_runs_sized_down(capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint_integrity.py"
    spec = importlib.util.spec_from_file_location("checkpoint_integrity_benchmark", script)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    report = benchmark.main(["--state-gib", "0.004", "--array-mib", "0.25", "--rounds", "1"])
    for side in ("orbax", "rlax"):
        assert set(report[side]) == {"blocking_s", "save_s", "restore_s"} and min(report[side].values()) > 0
    assert set(report["ratios"]) == {"blocking_s", "save_s", "restore_s"} and report["digest_gb_per_s_per_device"] > 0
    by_devices = report["seven_b"]["digest_s_by_devices"]
    assert by_devices["1"] == pytest.approx(64 * by_devices["64"])
    assert '"seven_b"' in capsys.readouterr().out


def test_a_file_added_to_a_checkpoint_after_its_seal_is_named_and_not_read(saved, tmp_path, caplog):
    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    (copy / "1" / "state" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    with caplog.at_level(logging.WARNING, logger="rlax_core.training.checkpoint_integrity"):
        Checkpointer(copy).restore(1, abstract_like(small_state()))
    assert "state/.DS_Store was not there when the checkpoint was sealed; it is not read" in caplog.text


def test_a_first_save_that_did_not_finish_is_no_checkpoint(tmp_path, caplog):
    save(tmp_path / "ckpt", steps=(5,))
    (tmp_path / "ckpt" / "5" / SEAL_NAME).unlink()  # killed between orbax's commit and the seal
    checkpointer = Checkpointer(tmp_path / "ckpt", async_save=False)
    with caplog.at_level(logging.WARNING, logger="rlax_core.training.checkpoint"):
        assert checkpointer.restore_newest(abstract_like(small_state())) is None  # start afresh
    assert "no finished checkpoint" in caplog.text and os.listdir(tmp_path / "ckpt" / "refused") == ["5"]
    checkpointer.save(5, small_state(), DataLedger())  # the step is written again
    assert checkpointer.all_steps() == [5]
    checkpointer.close()
