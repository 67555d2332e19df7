"""The simulator fed by compiled costs, on a real compile report of the small Qwen2-shaped recipe.

The fixture ``tests/fixtures/compile/small_qwen2_tpu.compiled.json`` is the unedited output of
``.venv-tpu/bin/rlax compile --config tests/fixtures/compile/small_qwen2_tpu.yaml --json ...``
(libtpu's compiler, no TPU; docs/fleet.md says when and at what load). Reading it needs no libtpu.
"""

from __future__ import annotations

import dataclasses
import json
import runpy
import sys
from pathlib import Path

import pytest

from pipelines.config import load_run_config
from pipelines.fleet import fleet_shape, predict_from_reports, read_reports
from rlax_core.fleet.compiled import fleet_params, read_compiled_costs

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "compile" / "small_qwen2_tpu.compiled.json"


@pytest.fixture
def report():
    return json.loads(FIXTURE.read_text())


@pytest.fixture
def shape(monkeypatch):
    monkeypatch.chdir(REPO)  # the report names its recipe relative to the repository
    return fleet_shape(load_run_config(json.loads(FIXTURE.read_text())["config"]))


def test_the_costs_are_the_compiled_programs_rooflines(report):
    costs = read_compiled_costs(report)
    by_name = {(p["role"], p["program"]): p for p in report["programs"]}
    assert costs.decode_step_s == by_name[("rollout", "decode 8 slots x 16 steps (tpu)")]["roofline_s"]
    assert costs.decode_slots == 8
    assert costs.prefill_s == {64: (4, by_name[("rollout", "prefill 4x64")]["roofline_s"]),
                               128: (4, by_name[("rollout", "prefill 4x128")]["roofline_s"])}
    assert costs.update_micro_batch_s == by_name[("trainer", "update step")]["roofline_s"]
    assert (costs.rollout_chip, costs.trainer_chip) == ("v5e", "v5p")
    assert costs.prefill_for(65)[:2] == (128, 4) and costs.prefill_for(64)[0] == 64
    assert costs.prefill_for(4096)[0] == 128  # longer than every bucket: the largest


def test_the_recipes_numbers_and_the_assumed_lengths(shape):
    assert (shape.rollout_workers, shape.trainer_hosts, shape.groups_per_step, shape.samples_per_prompt) == (1, 1, 2, 8)
    assert (shape.prompt_tokens, shape.completion_tokens) == (64, 192)  # smallest bucket; half of 384 new tokens
    assert shape.update_iterations == 2 and shape.max_staleness == 1
    # two scanned layers, XLA counting the block once: more than one layer's worth, less than two
    # (the classifier, outside the scan, is counted once either way)
    assert 1 < shape.layer_loop_factor < 2


def test_unrolled_layers_are_all_in_xlas_count(monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_run_config(json.loads(FIXTURE.read_text())["config"], ["trainer.scan_layers=false"])
    assert fleet_shape(config).layer_loop_factor == 1.0


def test_the_simulators_inputs_follow_from_the_compiled_costs(report, shape):
    costs = read_compiled_costs(report)
    params = fleet_params(costs, shape)
    assert shape.concurrent_sequences == 8  # 256 pages of 16 hold 9 budgets of 64 + 384 tokens; 8 slots
    assert params.seconds_per_token == pytest.approx(costs.decode_step_s / 8)
    assert params.tokens_per_group == 8 * 192
    assert params.group_overhead_s == pytest.approx(costs.prefill_s[64][1] / 4)  # one prefill row per group
    assert params.trainer_step_s == pytest.approx(2 * shape.layer_loop_factor * costs.update_micro_batch_s)
    network = shape.host_network_bytes_per_s
    assert params.weight_sync_s == pytest.approx(shape.weight_bytes / network * (1 + 1 / shape.trainer_hosts))
    assert params.groups_per_call == 1  # 8 slots / 8 samples


def test_a_kv_pool_too_small_for_every_slots_budget_decodes_fewer_sequences(report, shape):
    costs = read_compiled_costs(report)
    # 28 pages per 448-token budget and the sink page: 3 budgets fit.
    small_pool = dataclasses.replace(shape, num_pages=3 * 28 + 1, admission="reserve")
    assert small_pool.concurrent_sequences == 3
    assert fleet_params(costs, small_pool).seconds_per_token == pytest.approx(costs.decode_step_s / 3)
    # Pages on demand: a running sequence holds its 64-token prompt, 96 tokens on average (completions of
    # 192 tokens, half the budget) and a look-ahead page: 176 tokens, 7 of them in 84 pages of 16.
    on_demand = dataclasses.replace(small_pool, admission="on_demand")
    assert on_demand.occupancy_tokens == 96 and on_demand.concurrent_sequences == 7
    assert fleet_params(costs, on_demand).seconds_per_token == pytest.approx(costs.decode_step_s / 7)


def test_bad_shapes_are_refused_with_the_field(shape):
    with pytest.raises(ValueError, match="completion_tokens"):
        dataclasses.replace(shape, completion_tokens=shape.max_new_tokens + 1)
    with pytest.raises(ValueError, match="rollout_workers"):
        dataclasses.replace(shape, rollout_workers=0)


def test_a_report_without_the_trainer_says_what_to_compile_one_without_prefill_leaves_it_out(report, shape):
    rollout_only = dict(report, programs=[p for p in report["programs"] if p["role"] != "trainer"])
    with pytest.raises(ValueError, match="trainer's compiled update step.*--roles rollout,trainer"):
        read_compiled_costs(rollout_only)
    # The trainer's step given instead (benchmarks/fleet_sim.py --trainer-step-s): the rollout's report will do.
    given = read_compiled_costs(rollout_only, need_update=False)
    assert (given.trainer_chip, given.update_micro_batch_s) == (None, None)
    assert given.decode_step_s == read_compiled_costs(report).decode_step_s
    with pytest.raises(ValueError, match="give the trainer's seconds per step"):
        fleet_params(given, shape)
    assert fleet_params(given, shape, trainer_step_s=12.5).trainer_step_s == 12.5
    no_prefill = read_compiled_costs(dict(report, programs=[p for p in report["programs"]
                                                            if not p["program"].startswith("prefill")]))
    assert no_prefill.prefill_for(64) is None and no_prefill.prefill_per_group_s(64) == 0.0
    with pytest.raises(ValueError, match="not an `rlax compile --json` report"):
        read_compiled_costs({"config": "x"})


def test_reports_merge_role_by_role_the_first_report_naming_the_recipe(report, tmp_path):
    rollout_only = dict(report, programs=[dict(p, roofline_s=1.0) for p in report["programs"]
                                          if p["role"] == "rollout"], overrides=["loop.sampling.samples_per_prompt=4"])
    first, second = tmp_path / "rollout.json", tmp_path / "full.json"
    first.write_text(json.dumps(rollout_only))
    second.write_text(json.dumps(report))
    merged = read_reports([first, second])
    assert merged["overrides"] == ["loop.sampling.samples_per_prompt=4"]
    costs = read_compiled_costs(merged)
    assert costs.decode_step_s == 1.0  # the first report's rollout
    assert costs.update_micro_batch_s == read_compiled_costs(report).update_micro_batch_s  # the second's trainer


def test_the_prediction_beats_its_synchronous_baseline_and_stays_within_k(monkeypatch):
    monkeypatch.chdir(REPO)
    result = predict_from_reports([FIXTURE])
    ahead, synchronous = result["prediction"], result["baseline_k0"]
    assert ahead["seconds_per_step"] < synchronous["seconds_per_step"]
    assert set(ahead["staleness"]) <= {"0", "1"} and set(synchronous["staleness"]) == {"0"}
    assert sum(ahead["staleness"].values()) == pytest.approx(1.0)
    tokens_per_group = 8 * 192
    assert ahead["rollout_tokens_per_s"] == pytest.approx(ahead["groups_per_s"] * tokens_per_group)
    assert 0 <= ahead["trainer_idle_fraction"] <= 1 and 0 <= ahead["worker_busy_fraction"] <= 1
    # one worker generating a step flat out bounds the step from below
    assert ahead["seconds_per_step"] >= ahead["generation_s_per_step_one_worker"] * (1 - 1e-9)
    assert {v["from"].split(":")[0] for v in ahead["inputs"].values()} >= {"compiled", "recipe", "assumed"}


def _benchmark(monkeypatch, *args: str) -> None:
    """``python benchmarks/fleet_sim.py ARGS``, run in this process (the subprocess would import JAX again)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["benchmarks/fleet_sim.py", *args])
    runpy.run_path(str(REPO / "benchmarks" / "fleet_sim.py"), run_name="__main__")


def test_the_benchmark_predicts_from_a_compile_report(monkeypatch, capsys):
    _benchmark(monkeypatch, "--compiled", str(FIXTURE), "--markdown", "--completion-fraction", "0.25")
    out = capsys.readouterr().out
    payload = json.loads(out[:out.rindex("}") + 1])
    assert payload["benchmark"] == "fleet_sim_compiled"
    assert payload["prediction"]["inputs"]["completion_tokens"]["value"] == 96
    assert "| prediction | 1 |" in out and "| baseline_k0 | 0 |" in out
    _benchmark(monkeypatch, "--compiled", str(FIXTURE), "--trainer-step-s", "7.5")
    out = capsys.readouterr().out
    given = json.loads(out)["prediction"]["inputs"]["trainer_step_s"]
    assert given == {"value": 7.5, "from": "assumed: given"}
    with pytest.raises(SystemExit, match="cannot read the compile report no-such-report.json"):
        _benchmark(monkeypatch, "--compiled", "no-such-report.json")


def test_a_loop_corrected_update_is_the_whole_trainer_step(report, shape):
    """A report carrying the update's loop-corrected roofline (``roofline_per_run_s``): that is the
    trainer's step, not the per-trip figure scaled by the recipe's loop counts."""
    update = next(p for p in report["programs"] if p["role"] == "trainer")
    update["roofline_per_run_s"] = 123.0
    costs = read_compiled_costs(report)
    assert costs.update_step_s == 123.0
    assert fleet_params(costs, shape).trainer_step_s == 123.0


def test_the_decode_step_counts_the_kv_pages_of_the_running_sequences(report, shape):
    """The report's decode (compiled before ``rlax compile`` counted KV reads) with the recipe's bytes
    per page: a step of n sequences is XLA's bytes plus n sequences' whole pages at the mean context."""
    from pipelines.fleet import kv_reads_of

    costs = read_compiled_costs(report, **kv_reads_of(load_run_config(report["config"]), report))
    step = costs.decode
    decode = next(p for p in report["programs"] if p["program"].startswith("decode"))
    assert (step.xla_bytes, step.slots, step.page_size) == (decode["bytes_accessed"], 8, 16)
    # 2 layers x (K, V) x 1 KV head per chip (4 over tensor_parallel 4) x 16 tokens x 128 x 2 bytes
    assert step.kv_bytes_per_page == 2 * 2 * 1 * 16 * 128 * 2
    context = shape.mean_context  # 64-token prompt + 96 written on average: 160 tokens, 10 pages
    assert context == 160
    assert step.bytes([context] * 8) == decode["bytes_accessed"] + 8 * 10 * step.kv_bytes_per_page
    params = fleet_params(costs, shape)
    assert params.decode_step_s(8) > params.decode_step_s(1) > 0


SEVEN_B = "configs/qwen25_7b_math_dataflow_tpu.yaml"


def test_the_7b_packed_recipe_at_k1_is_no_slower_than_at_k0(monkeypatch):
    """The k = 1 artefact of whole engine calls (docs/fleet.md): with work handed out in units of groups
    the 7B recipe's fleet at k = 1 is at least as fast as at k = 0, its trainer's packed step of 8.22 s
    below the fleet's generation. Decode: the compiled v5e step's XLA FLOPs and HBM bytes (docs/compile.md,
    "Eight-bit decode, compiled"; docs/fleet.md: 11.5 s against 22.5 s a step), and with XLA's count of
    the program as it runs, which the tables gave before (18.9 s against 37.0 s)."""
    from rlax_core.compile.decode_step import DecodeStepCost
    from rlax_core.fleet.compiled import CompiledCosts, predict
    from pipelines.fleet import kv_reads_of

    monkeypatch.chdir(REPO)
    config = load_run_config(SEVEN_B)
    shape = fleet_shape(config)
    kv = kv_reads_of(config, {"programs": [{"role": "rollout", "program": "decode 256 slots x 16 steps (tpu)"}]})
    assert (kv["kv_bytes_per_page"], kv["page_size"]) == (917504, 64)  # as the compile report counted them
    for step_bytes in (6583811584.0, 14303424512.0):  # HBM's; XLA's count as run
        decode = DecodeStepCost("v5e", 256, 906925047808.0, step_bytes, kv["kv_bytes_per_page"], kv["page_size"])
        costs = CompiledCosts("v5e", "v5p", decode.seconds_at(256, shape.mean_context), 256, {}, None, 8.22, decode)
        one, zero = (predict(costs, dataclasses.replace(shape, max_staleness=k), trainer_step_s=8.22) for k in (1, 0))
        assert one["seconds_per_step"] <= zero["seconds_per_step"] * (1 + 1e-6)
        assert one["rollout_tokens_per_s"] >= zero["rollout_tokens_per_s"] * (1 - 1e-6)
        assert one["staleness"].get("1", 0) > 0


def test_plan_chips_proposes_the_split_that_trains_the_most_tokens(monkeypatch, capsys):
    from pipelines.cli import main
    from pipelines.fleet import best_split

    monkeypatch.chdir(REPO)

    sweep = best_split([FIXTURE], 40, trainer_step_s=0.5)
    rates = [row["tokens_trained_per_s"] for row in sweep["splits"]]
    assert sweep["best"]["tokens_trained_per_s"] == max(rates) and len(rates) >= 8
    for row in sweep["splits"]:
        assert row["trainer_chips"] + row["rollout_chips"] <= 40 and row["trainer_chips"] % 4 == 0
        assert row["trainer_step_s"] == pytest.approx(0.5 * 4 / row["trainer_chips"])
    # a slow trainer wants more of the chips than a fast one
    slow = best_split([FIXTURE], 40, trainer_step_s=50.0)["best"]
    assert slow["trainer_chips"] >= sweep["best"]["trainer_chips"]
    assert main(["plan", "--chips", "40", "--compiled", str(FIXTURE), "--trainer-step-s", "0.5"]) == 0
    assert "train the most tokens" in capsys.readouterr().out
    assert main(["plan", "--chips", "40"]) == 2
    assert "needs the recipe's compile reports" in capsys.readouterr().err


def test_the_benchmark_prints_a_row_per_configuration(monkeypatch, capsys):
    _benchmark(monkeypatch, "--rows", f"{FIXTURE},{FIXTURE}", str(FIXTURE), "--trainer-step-s", "0.5", "--markdown")
    out = capsys.readouterr().out
    rows = json.loads(out[:out.rindex("}") + 1])["rows"]
    assert len(rows) == 2 and rows[0]["prediction"] == rows[1]["prediction"]
    per_chip = rows[0]["prediction"]["rollout_tokens_per_s_per_chip"]
    assert per_chip == pytest.approx(rows[0]["prediction"]["rollout_tokens_per_s"] / 4)  # 1 worker of 4 chips
    assert "| small_qwen2_tpu.yaml | 1 x v5e 4 chips: bfloat16 weights, bfloat16 KV, 256 pages | 8 |" in out


# The 7B math recipe's decode on its v5e workers and an 8B reward model's forward on v6e chips of a
# scoring stage of its own: the unedited `rlax compile --json` reports of docs/fleet.md's scoring table.
SCORING = REPO / "tests" / "fixtures" / "compile" / "fleet_7b_rm"


def test_the_scoring_stage_costs_the_reward_models_compiled_forward_per_sequence(monkeypatch):
    monkeypatch.chdir(REPO)
    report = read_reports([SCORING / "rm8b-v6e-4.json", SCORING / "decode-7b-v5e.json"])
    forward, = [p for p in report["programs"] if p["role"] == "reward_model"]
    costs = read_compiled_costs(report, need_update=False)
    assert forward["program"] == "reward model forward 8x2048"
    assert costs.scoring_sequence_s == pytest.approx(forward["roofline_per_run_s"] / 8)  # every layer, per row
    shape = fleet_shape(load_run_config(report["config"], report["overrides"]))
    assert shape.scoring_servers == 4  # 4 hosts of one v6e chip: one model per process, whole on one chip
    params = fleet_params(costs, shape, trainer_step_s=8.22)
    assert params.scoring_s_per_group == pytest.approx(8 * costs.scoring_sequence_s)  # G = 8 samples a group
    # The recipe without a reward model has no scoring stage; a reward model report asks for one.
    plain = fleet_shape(load_run_config("configs/qwen25_7b_math_dataflow_tpu.yaml"))
    assert plain.scoring_servers == 0
    without = read_compiled_costs(read_reports([SCORING / "decode-7b-v5e.json"]), need_update=False)
    with pytest.raises(ValueError, match="no compiled reward model forward"):
        fleet_params(without, shape, trainer_step_s=8.22)


def test_a_reward_model_stage_lengthens_the_step_and_one_chip_makes_it_the_bound(monkeypatch):
    monkeypatch.chdir(REPO)
    decode = SCORING / "decode-7b-v5e.json"
    plain = predict_from_reports([decode], trainer_step_s=8.22)["prediction"]
    four = predict_from_reports([SCORING / "rm8b-v6e-4.json", decode], trainer_step_s=8.22)["prediction"]
    one = predict_from_reports([SCORING / "rm8b-v6e-1-k2.json", decode], trainer_step_s=8.22)["prediction"]
    assert plain["scoring_busy_fraction"] == 0 and plain["bound_by"] == "rollout"
    assert four["seconds_per_step"] > plain["seconds_per_step"]
    # One chip scores a step's 64 groups x 8 samples in 512 forwards' time: with k = 2 it is the step.
    work = 64 * four["inputs"]["scoring_s_per_group"]["value"]
    assert one["bound_by"] == "scoring" and one["seconds_per_step"] == pytest.approx(work, rel=0.02)
    assert one["seconds_per_step"] >= plain["seconds_per_step"]
