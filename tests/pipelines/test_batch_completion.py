"""Batch outputs that say they are complete: `_INCOMPLETE` first, `_SUCCESS` last; every reader refuses a
folder a batch command did not finish, naming the command to run again; a rerun clears what was left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.cli import main
from rlax_core.config import InputError
from rlax_core.data.completion import (INCOMPLETE, SUCCESS, begin_output, complete_output, output_folder,
                                       require_complete)

REPO = Path(__file__).resolve().parents[2]
STORIES = "pipelines/assets/stories260K"


def test_a_folder_is_complete_only_between_its_last_write_and_the_next_run(tmp_path):
    out = str(tmp_path / "out")
    begin_output(out, "rlax curate", "rlax curate --input x.jsonl --output out", writes=("examples-*-of-*.parquet",))
    (tmp_path / "out" / "examples-00000-of-00001.parquet").write_bytes(b"PAR1")
    with pytest.raises(InputError) as raised:
        require_complete(f"{out}/examples-*.parquet", "input")
    assert str(raised.value).startswith(f"input {out}/examples-*.parquet: {out} is not a complete output: rlax "
                                        "curate started writing it at ")
    assert str(raised.value).endswith("and did not finish (interrupted, or it failed); run it again: rlax curate "
                                      "--input x.jsonl --output out")
    complete_output(out, "rlax curate", "rlax curate ...", 1.0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [SUCCESS, "examples-00000-of-00001.parquet"]
    for path in (out, f"{out}/examples-*.parquet", f"{out}/examples-00000-of-00001.parquet"):
        require_complete(path, "input")
    # The next run: incomplete again from its first write; the old shards go (a new run may cut fewer).
    (tmp_path / "out" / "beam-temp-examples-1234").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("not the command's")
    begin_output(out, "rlax curate", "rlax curate ...", writes=("examples-*-of-*.parquet",))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [INCOMPLETE, "mine.txt"]


@pytest.mark.parametrize("left, says", [
    ("beam-temp-examples-0a1b", "a Beam job left beam-temp-examples-0a1b in it and no _SUCCESS"),
    ("examples-00000-of-00002.parquet", "it holds examples-00000-of-00002.parquet but no _SUCCESS"),
])
def test_a_folder_without_a_record_but_with_a_batch_commands_leftovers_is_refused(tmp_path, left, says):
    (tmp_path / left).mkdir() if left.startswith("beam-temp") else (tmp_path / left).write_bytes(b"")
    with pytest.raises(InputError, match=says):
        require_complete(str(tmp_path), "train set")


def test_someones_own_folder_of_data_files_is_read_as_it_is(tmp_path):
    (tmp_path / "train_100.parquet").write_bytes(b"")
    (tmp_path / "examples-0.parquet").write_bytes(b"")
    for path in (str(tmp_path), f"{tmp_path}/*.parquet", f"{tmp_path}/train_100.parquet", "hf:openai/gsm8k"):
        require_complete(path, "input")
    assert output_folder(f"{tmp_path}/examples-*.parquet") == str(tmp_path)
    assert output_folder("hf:openai/gsm8k") is None


def test_the_training_set_reader_refuses_an_incomplete_folder(tmp_path):
    from rlax_core.data.training_set import read_examples

    begin_output(str(tmp_path), "rlax filter", "rlax filter --output x", writes=())
    with pytest.raises(InputError, match="run it again: rlax filter --output x"):
        read_examples(str(tmp_path))


def test_a_gcs_output_folder_says_whether_it_is_complete(gcs_emulator):
    out = f"{gcs_emulator.make_bucket()}/curated"
    begin_output(out, "rlax curate", "rlax curate --output gs", writes=("examples-*-of-*.parquet",))
    with pytest.raises(InputError, match="rlax curate started writing it"):
        require_complete(f"{out}/examples-*.parquet", "input")
    complete_output(out, "rlax curate", "rlax curate --output gs", 2.0)
    require_complete(f"{out}/examples-*.parquet", "input")


def _gsm8k_rows(path: Path, count: int) -> None:
    with open(path, "w") as handle:
        for i in range(count):
            a, b = 1000 + 7 * i, 3 * i + 11
            handle.write(json.dumps({"question": f"Sam has {a} marbles and finds {b} more in box {i}. How many now?",
                                     "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}) + "\n")


@pytest.mark.slow  # two curate runs: ~40 s on an idle 2-core machine
def test_sigterm_mid_curate_leaves_a_folder_filter_refuses_and_a_rerun_completes(tmp_path, capsys):
    raw, out = tmp_path / "raw.jsonl", tmp_path / "curated"
    _gsm8k_rows(raw, 3000)
    argv = ["curate", "--input", str(raw), "--format", "gsm8k", "--output", str(out)]
    curate = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out.is_dir() and list(out.glob("beam-temp-*"))):  # the job is writing: stop it there
            assert curate.poll() is None, curate.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "curate never started writing"
            time.sleep(0.02)
        curate.send_signal(signal.SIGTERM)
        assert curate.wait(60) != 0
    finally:
        if curate.poll() is None:
            curate.kill()
    assert (out / INCOMPLETE).exists() and not (out / SUCCESS).exists() and list(out.glob("beam-temp-*"))

    code = main(["filter", "--input", f"{out}/examples-*.parquet", "--model", STORIES, "--output", str(tmp_path / "f")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error, error
    assert error.startswith(f"rlax filter: input error: input {out}/examples-*.parquet: {out} is not a complete "
                            "output: rlax curate started writing it at ")
    assert error.endswith("run it again: rlax " + " ".join(argv))
    assert not (tmp_path / "f").exists()

    done = subprocess.run([sys.executable, "-m", "pipelines.cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [SUCCESS, "dead_letter-00000-of-00001.jsonl",
                                                     "examples-00000-of-00001.parquet", "stats.json"]
    assert json.loads((out / "stats.json").read_text())["kept"] == 3000
    require_complete(f"{out}/examples-*.parquet", "input")


def test_a_command_rerun_reads_its_input_from_the_folder_it_rewrites(tmp_path, capsys):
    # `rlax curate --input data/raw.jsonl --output data`, cut short: running it again must not be
    # refused because its own output folder is the one left incomplete.
    _gsm8k_rows(tmp_path / "raw.jsonl", 4)
    begin_output(str(tmp_path), "rlax curate", "rlax curate ...", writes=())
    assert main(["curate", "--input", str(tmp_path / "raw.jsonl"), "--format", "gsm8k", "--output", str(tmp_path),
                 "--runner", "FnApiRunner"]) == 0
    assert (tmp_path / SUCCESS).exists() and not (tmp_path / INCOMPLETE).exists()
    capsys.readouterr()
