"""Eight-bit decode compiled for TPU without one (libtpu, the lock-tpu environment): the small
Qwen2-shaped recipe's decode in bfloat16, with int8 weights, and with int8 weights and KV pages,
at the same running sequences. ``rlax compile`` reports each step's bytes with the KV pages its
Mosaic kernel reads (``compile.decode_step``) and the full-width copies of held arrays it finds.
The QwQ-32B figures, compiled the same way, are in docs/compile.md ("Eight-bit decode")."""

from __future__ import annotations

import pytest

from tests.support.rlax_compile import run_compile

pytestmark = pytest.mark.tpu

RECIPE = "tests/fixtures/compile/small_qwen2_tpu.yaml"
DTYPES = {"bf16": [], "w8": ["engine.weight_dtype=int8"],
          "w8kv8": ["engine.weight_dtype=int8", "engine.cache_dtype=int8"]}


@pytest.fixture(scope="module")
def decodes(tmp_path_factory):
    out = {}
    for name, overrides in DTYPES.items():
        report = run_compile(tmp_path_factory.mktemp(name), RECIPE, ["--roles", "rollout", "--programs", "decode",
                                                                      *overrides])
        (decode,) = report["programs"]
        out[name] = dict(decode, stdout=report["stdout"])
    return out


def test_every_eight_bit_decode_keeps_the_mosaic_kernel_and_reports_its_kv_reads(decodes):
    for name, decode in decodes.items():
        assert decode["compiled"] and decode["kernels"] == ["paged_attention"], name
        step = decode["decode_step"]
        # the recipe's 8 running sequences; one page on a chip: 2 (K, V) x 2 layers x 1 KV head x 16 tokens x 128
        assert step["running_sequences"] == 8
        per_head_token = {"bf16": 2, "w8": 2, "w8kv8": 1 + 4}[name]  # int8 and its scale, broadcast 128 wide
        assert decode["kv_bytes_per_page"] == 2 * 2 * 1 * 16 * 128 * per_head_token, name
        assert step["step_bytes"] == step["xla_bytes"] + step["kv_read_bytes"]
        assert "one step of 8 sequences" in decode["stdout"]


def test_int8_weights_read_fewer_bytes_with_no_full_width_copy_in_the_decode_loop(decodes):
    bf16, w8 = decodes["bf16"]["decode_step"], decodes["w8"]["decode_step"]
    assert w8["xla_bytes"] < 0.75 * bf16["xla_bytes"]
    assert w8["kv_read_bytes"] == bf16["kv_read_bytes"]
    assert [c for c in decodes["w8"]["full_width"] if "once a call" not in c] == []
    assert [c for c in decodes["bf16"]["full_width"] if "once a call" not in c] == []


def test_int8_pages_cost_a_full_width_scale_broadcast_per_layer_on_tpu(decodes):
    """JAX's TPU kernel takes eight-bit pages as a ``QuantizedTensor`` whose wrapper broadcasts the
    scales to the pages' full width (``inference.pallas_attention``): XLA forms a float32 array as
    wide as each layer's pool, keys and values, at every step. This is what bounds an int8 KV cache
    on TPU until a kernel reads the scales as they are held; the test fails once that is fixed."""
    broadcasts = [c for c in decodes["w8kv8"]["full_width"] if "f32[1,256,16,128]" in c and "once a call" not in c]
    assert len(broadcasts) == 2 * 2  # 2 layers x (K, V)
    assert decodes["w8kv8"]["decode_step"]["step_bytes"] > decodes["w8"]["decode_step"]["step_bytes"]
