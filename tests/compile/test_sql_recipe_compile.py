"""The TPU lane: the text-to-SQL production recipe's rollout engine compiled by libtpu for its v5e 2x2 workers.

``configs/qwen25_coder_7b_sql_dataflow_tpu.yaml`` serves Qwen2.5-Coder-7B-Instruct tensor-parallel over
a v5e host's 4 chips with Spider's long schema prompts (prefill buckets up to 2,048 tokens). The
decode program (the one holding the KV pool) and the longest prefill must compile and fit the chip
(docs/sql.md quotes one run: 14.36 GiB per chip of 16).
"""

from __future__ import annotations

import pytest

from tests.support.rlax_compile import run_compile

pytestmark = pytest.mark.tpu

RECIPE = "configs/qwen25_coder_7b_sql_dataflow_tpu.yaml"
HBM_V5E = 16 << 30


def test_the_sql_recipes_engine_compiles_for_v5e_and_fits_its_chips(tmp_path):
    report = run_compile(tmp_path, RECIPE, ["--roles", "rollout", "--programs", "prefill 4x2048,decode"], timeout=1500)
    programs = {p["program"]: p for p in report["programs"]}
    assert set(programs) == {"prefill 4x2048", "decode 256 slots x 16 steps (tpu)"}, sorted(programs)
    for program in programs.values():
        assert program["compiled"] and program["topology"] == "v5e:2x2", program
        assert program["peak_bytes"] < HBM_V5E, program
    assert "paged_attention" in programs["decode 256 slots x 16 steps (tpu)"]["kernels"]
    assert any(k.startswith("splash") for k in programs["prefill 4x2048"]["kernels"])
