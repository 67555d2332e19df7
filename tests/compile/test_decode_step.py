"""A decode step's cost counted by hand (XLA's bytes plus the KV pages the kernel reads), and the
check for full-width copies of held arrays on HLO text of the form libtpu prints."""

import pytest

from rlax_core.compile.decode_step import DecodeStepCost, full_width_arrays
from rlax_core.inference.config import EngineConfig
from rlax_core.models.config import ModelConfig
from rlax_core.planning.hardware import CHIP_PEAKS
from rlax_core.planning.memory import decode_kv_read_bytes

MODEL = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                    num_kv_heads=4, head_dim=8)
ENGINE = EngineConfig(num_slots=4, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                      prefill_buckets=(8,), cache_dtype="bfloat16", tensor_parallel=2)


def test_a_decode_step_is_xlas_bytes_plus_the_running_sequences_whole_pages_as_by_hand():
    # One page on one chip: 2 (K, V) x 2 layers x 2 KV heads (4 over tensor_parallel 2) x 4 tokens x 8 x 2 bytes.
    page = decode_kv_read_bytes(MODEL, ENGINE, [ENGINE.page_size])
    assert page == 2 * 2 * 2 * 4 * 8 * 2 == 512
    step = DecodeStepCost("v5e", slots=4, xla_flops=4e6, xla_bytes=1e6, kv_bytes_per_page=page, page_size=4)
    # sequences of 3, 4 and 9 tokens hold 1, 1 and 3 pages: 5 pages, 2,560 bytes beside XLA's 1 MB
    assert step.kv_read_bytes([3, 4, 9]) == 5 * 512
    assert step.bytes([3, 4, 9]) == 1e6 + 2560
    peak = CHIP_PEAKS["v5e"]
    assert step.seconds([3, 4, 9]) == pytest.approx(max(3e6 / peak.bf16_flops, (1e6 + 2560) / peak.hbm_bytes_per_s))
    assert step.seconds_at(3, 9) == step.seconds([9, 9, 9])
    # int8 pages: 8 bytes and a float32 scale a head-token (3/4 of these 16); our TPU kernel reads a
    # page's 4 scales as one 128-lane row of HBM: 4 x 8 + 128 x 4 bytes a page-head, against 4 x 16.
    int8 = EngineConfig(**{**ENGINE.__dict__, "cache_dtype": "int8"})
    assert decode_kv_read_bytes(MODEL, int8, [4]) == 512 * 12 // 16
    assert decode_kv_read_bytes(MODEL, int8, [4], kernel="tpu") == 2 * 2 * 2 * (4 * 8 + 128 * 4)
    # at 128-token pages the row is exactly the page's scales: 128 x (128 + 4) bytes a page-head
    wide = ModelConfig(**{**MODEL.__dict__, "head_dim": 128})
    int8_128 = EngineConfig(**{**int8.__dict__, "page_size": 128})
    assert decode_kv_read_bytes(wide, int8_128, [5], kernel="tpu") == decode_kv_read_bytes(wide, int8_128, [5]) \
        == 2 * 2 * 2 * 128 * (128 + 4)


# Lines as libtpu's compiled HLO prints them: a fusion's body, the loop body calling it, and the entry.
HLO = """\
%fused_computation.1 (param_0: s8[2,12,4,8]) -> bf16[2,12,4,8] {
  %param_0 = s8[2,12,4,8]{3,2,1,0} parameter(0)
  ROOT %convert.1 = bf16[2,12,4,8]{3,2,1,0} convert(%param_0)
}

%body.2 (arg: (s8[2,12,4,8], f32[2,12,4])) -> (s8[2,12,4,8], f32[2,12,4]) {
  %arg = (s8[2,12,4,8]{3,2,1,0}, f32[2,12,4]{2,1,0}) parameter(0)
  %get-tuple-element.3 = s8[2,12,4,8]{3,2,1,0} get-tuple-element(%arg), index=0
  %get-tuple-element.4 = f32[2,12,4]{2,1,0} get-tuple-element(%arg), index=1
  %fusion.5 = bf16[2,12,4,8]{3,2,1,0} fusion(%get-tuple-element.3), kind=kLoop, calls=%fused_computation.1
  %broadcast_in_dim.6 = f32[2,12,4,8]{3,2,1,0:T(8,128)} broadcast(%get-tuple-element.4), dimensions={0,1,2}
  %copy.7 = s8[64,2,8]{2,0,1:T(8,128)} copy(%param.9)
  %scatter.8 = s8[2,12,4,8]{3,2,1,0} scatter(%get-tuple-element.3, %a, %b), to_apply=%add
}

ENTRY %main.9 (param.9: s8[64,2,8]) -> s8[64,2,8] {
  %param.9 = s8[64,2,8]{2,1,0} parameter(0)
  ROOT %copy.10 = s8[64,2,8]{2,1,0} copy(%param.9)
}
"""


def test_full_width_copies_are_the_materialised_copies_and_widenings_of_held_arrays():
    held = (("int8", (2, 12, 4, 8)), ("float32", (2, 12, 4)), ("int8", (64, 2, 8)), ("float32", (64,)))
    found = full_width_arrays(HLO, held)
    # the dequantised pool (a fusion's output), the scales broadcast to the pool's width, and the
    # weight's copies; not the fusion's own body, the parameters, nor the in-place scatter
    assert found == ("fusion.5 = bf16[2,12,4,8] fusion (in body.2)", "broadcast_in_dim.6 = f32[2,12,4,8] broadcast "
                     "(in body.2)", "copy.7 = s8[64,2,8] copy (in body.2)", "copy.10 = s8[64,2,8] copy (once a call)")
    assert full_width_arrays(HLO, (("int8", (5, 5)),)) == ()


def test_a_decode_steps_bytes_are_its_hbm_bytes_where_counted_else_xlas():
    from rlax_core.compile.decode_step import decode_step_bytes

    assert decode_step_bytes({"bytes_accessed": 3e9, "hbm_bytes_accessed": 1e9}) == 1e9
    assert decode_step_bytes({"bytes_accessed": 3e9, "hbm_bytes_accessed": None}) == 3e9
    assert decode_step_bytes({"bytes_accessed": 3e9}) == 3e9  # a report written before HBM bytes were counted
