"""benchmarks/gpu_decode.py runs end to end in its CPU dry run (the kernel interpreted, tiny sizes)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_decode.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_checks_the_kernel_and_reports_decode_against_the_bound(capsys):
    report = _script().main(["--dry-run"])
    assert report["dry_run"] and report["platform"] == "cpu"
    assert report["kernel"]["matches_reference"] and report["kernel"]["max_abs_error"] < 2e-2
    assert report["bandwidth_gb_per_s"] > 0 and report["kernel"]["gb_per_s"] > 0
    [engine] = report["engine"]
    assert engine["batch"] == 2 and 0 < engine["tokens_per_s"] and 0 < engine["of_bound"]
    assert '"engine"' in capsys.readouterr().out


def test_without_a_gpu_it_says_so_instead_of_measuring_the_cpu():
    with pytest.raises(SystemExit) as exited:
        _script().main([])
    assert exited.value.code == 2
