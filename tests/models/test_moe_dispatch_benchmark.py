"""benchmarks/moe_dispatch.py runs at a tiny size, as docs/models.md writes it: every dispatch is checked
against one device's outputs and gradients, then timed against the gather the model runs."""

import importlib.util
import shlex
from pathlib import Path

import jax
import pytest

from tests.support.doc_commands import markdown_commands

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "moe_dispatch.py"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (tests/conftest.py)")
def test_the_benchmark_checks_and_times_each_dispatch(capsys):
    spec = importlib.util.spec_from_file_location("moe_dispatch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (command,) = [c for c in markdown_commands(REPO / "docs" / "models.md") if "benchmarks/moe_dispatch.py" in c
                  and "--tokens" in c]
    assert shlex.split(command)[:2] == ["python", "benchmarks/moe_dispatch.py"]
    report = module.main(shlex.split(command)[2:])
    assert set(report["vs_gather"]) == {"gather", "all_to_all", "auto"} and report["vs_gather"]["gather"] == 1.0
    assert all(seconds > 0 for seconds in report["seconds"].values()) and len(report["load_average"]) == 3
    assert '"vs_gather"' in capsys.readouterr().out
