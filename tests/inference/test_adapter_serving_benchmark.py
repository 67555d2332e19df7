"""benchmarks/adapter_serving.py runs end to end at a tiny size and reports both modes against the base:
the command docs/lora.md writes, as written."""

import importlib.util
import shlex
from pathlib import Path

from tests.support.doc_commands import markdown_commands

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "adapter_serving.py"


def _script():
    spec = importlib.util.spec_from_file_location("adapter_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_measures_both_modes_and_picks_the_faster_per_version(capsys):
    (command,) = [c for c in markdown_commands(REPO / "docs" / "lora.md") if "benchmarks/adapter_serving.py" in c]
    assert shlex.split(command)[:2] == ["python", "benchmarks/adapter_serving.py"]
    report = _script().main(shlex.split(command)[2:])
    [result] = report["results"]
    for mode in ("merged", "on_the_fly"):
        assert result[mode]["swap_s"] > 0 and result[mode]["tokens_per_s"] > 0
    assert result["base_tokens_per_s"] > 0 and result["on_the_fly_vs_merged"]["tokens_per_s"] > 0
    per_version = result["seconds_per_version"]
    assert result["auto"] == min(per_version, key=per_version.get)
    assert len(report["load_average"]) == 3 and '"on_the_fly_vs_merged"' in capsys.readouterr().out
