"""`rlax --help` and every subcommand's help work, through the installed console script."""

import shutil
import subprocess
import sys

import pytest

from pipelines.cli import SUBCOMMANDS, main


def _rlax(*args: str) -> subprocess.CompletedProcess:
    script = shutil.which("rlax") or shutil.which("rlax", path=str(__import__("pathlib").Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "pipelines.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def test_top_level_help_lists_every_subcommand():
    result = _rlax("--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and f"rlax {name}" in out
    assert "not available yet" not in out, f"rlax {name} has not landed"


def test_config_errors_are_reported_without_traceback(tmp_path):
    result = _rlax("train", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "config file not found" in result.stderr
    assert "Traceback" not in result.stderr
