"""benchmarks/device_check.py runs end to end in its CPU dry run (a tiny model, tiny sizes), as the
device machine will run it on a ~0.5B model: the engine's decode against the HBM roofline, prefill
and update-step MFU, and XLA's compiled estimates beside each measurement."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_measures_each_phase_beside_what_xla_compiled_for_it(tmp_path, capsys):
    out = tmp_path / "device_check.json"
    report = _script().main(["--dry-run", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out) == report
    assert report["dry_run"] and report["platform"] == "cpu" and report["skipped"] == []
    assert report["chip"] is None and report["peaks"] is None  # a CPU: no published peaks, no MFU
    assert report["bandwidth_gb_per_s"] > 0
    [decode] = report["decode"]
    assert decode["sequences"] == 2 and decode["tokens_per_s"] > 0
    # Weights plus the KV pages of two sequences at the mean context (one 64-token page each here).
    assert decode["bytes_per_step"] == pytest.approx(2 * report["params"] + 2 * 64 * (2 * 2 * 2 * 16 * 2))
    assert decode["roofline_tokens_per_s"] == pytest.approx(2 * report["bandwidth_gb_per_s"] * 1e9
                                                           / decode["bytes_per_step"])
    assert decode["of_roofline"] == pytest.approx(decode["tokens_per_s"] / decode["roofline_tokens_per_s"])
    for phase in (decode, report["prefill"], report["update_step"]):
        compiled = phase["compiled"]
        assert compiled["peak_bytes"] > compiled["argument_bytes"] > 0 and compiled["flops"] > 0
    for phase in (report["prefill"], report["update_step"]):
        assert phase["seconds"] > 0 and phase["model_flops"] > 0 and phase["mfu"] is None


def test_the_model_flops_are_the_forward_without_the_classifier_for_prefill_and_three_forwards_to_train():
    module = _script()
    model = module.PUBLISHED_CONFIGS[module.MODEL]
    assert 0.49e9 < model.num_params < 0.50e9  # Qwen2.5-0.5B's shape
    head = 2 * model.vocab_size * model.hidden_size
    assert module.prefill_flops(model, 2, 128) == pytest.approx(2 * 128 * (model.flops_per_token(128) - head))


def test_without_an_accelerator_it_says_so_instead_of_measuring_the_cpu():
    with pytest.raises(SystemExit) as exited:
        _script().main([])
    assert exited.value.code == 2


def test_phases_past_the_budget_are_named_and_the_check_fails(tmp_path):
    out = tmp_path / "device_check.json"
    with pytest.raises(SystemExit) as exited:
        _script().main(["--dry-run", "--budget-s", "0", "--out", str(out)])
    assert exited.value.code == 1
    report = json.loads(out.read_text())
    assert report["skipped"] == ["decode, 2 sequence(s)", "prefill", "update step"]
    assert report["decode"] == [] and "prefill" not in report and report["bandwidth_gb_per_s"] > 0


@pytest.mark.parametrize("kind, chip", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                                        ("NVIDIA L4", "l4"), ("NVIDIA L40S", None), ("NVIDIA H100 PCIe", None),
                                        ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v6 lite", "v6e"), ("cpu", None)])
def test_the_chip_is_read_from_the_device_kind_jax_reports(kind, chip):
    from rlax_core.planning.hardware import chip_of_device_kind

    assert chip_of_device_kind(kind) == chip
