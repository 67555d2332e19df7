"""Eight-bit decode compiled for TPU without one (libtpu, the lock-tpu environment): the small
Qwen2-shaped recipe's decode in bfloat16, with int8 weights, and with int8 weights and KV pages
(read by our own kernel, ``inference.pallas_eight_bit``), at the same running sequences. ``rlax compile`` reports each step's bytes with the KV pages its
Mosaic kernel reads (``compile.decode_step``) and the full-width copies of held arrays it finds.
The QwQ-32B figures, compiled the same way, are in docs/compile.md ("Eight-bit decode")."""

from __future__ import annotations

import pytest

from tests.support.rlax_compile import run_compile

pytestmark = pytest.mark.tpu

RECIPE = "tests/fixtures/compile/small_qwen2_tpu.yaml"
# 128-token pages, the recipes': a page's scales are then one lane-row of HBM. With fewer tokens a page
# XLA:TPU lays a scale pool out pages-minor (no padding) and copies it for the kernel (kv_cache).
PAGES = ["engine.page_size=128"]
DTYPES = {"bf16": PAGES, "w8": [*PAGES, "engine.weight_dtype=int8"],
          "w8kv8": [*PAGES, "engine.weight_dtype=int8", "engine.cache_dtype=int8"]}


@pytest.fixture(scope="module")
def decodes(tmp_path_factory):
    out = {}
    for name, overrides in DTYPES.items():
        report = run_compile(tmp_path_factory.mktemp(name), RECIPE, ["--roles", "rollout", "--programs", "decode",
                                                                      *overrides])
        (decode,) = report["programs"]
        out[name] = dict(decode, stdout=report["stdout"])
    return out


def test_every_eight_bit_decode_keeps_a_mosaic_kernel_and_reports_its_kv_reads(decodes):
    for name, decode in decodes.items():
        kernel = "eight_bit_paged_attention" if name == "w8kv8" else "paged_attention"  # ours, JAX's
        assert decode["compiled"] and decode["kernels"] == [kernel], name
        step = decode["decode_step"]
        # the recipe's 8 running sequences; one page on a chip: 2 (K, V) x 2 layers x 1 KV head x 128 tokens x
        # 128 numbers; int8 pages add their row of 128 float32 scales
        assert step["running_sequences"] == 8
        page_head = {"bf16": 128 * 128 * 2, "w8": 128 * 128 * 2, "w8kv8": 128 * (128 + 4)}[name]
        assert decode["kv_bytes_per_page"] == 2 * 2 * 1 * page_head, name
        assert step["step_bytes"] == step["xla_bytes"] + step["kv_read_bytes"]
        assert "one step of 8 sequences" in decode["stdout"]


def test_int8_weights_read_fewer_bytes_with_no_full_width_copy_in_the_decode_loop(decodes):
    bf16, w8 = decodes["bf16"]["decode_step"], decodes["w8"]["decode_step"]
    assert w8["xla_bytes"] < 0.75 * bf16["xla_bytes"]
    assert w8["kv_read_bytes"] == bf16["kv_read_bytes"]
    assert [c for c in decodes["w8"]["full_width"] if "once a call" not in c] == []
    assert [c for c in decodes["bf16"]["full_width"] if "once a call" not in c] == []


def test_int8_pages_are_read_through_our_kernel_with_no_full_width_copy_and_fewer_bytes(decodes):
    """Our kernel (``inference.pallas_eight_bit``) reads the scale pools as held: no float32 array as
    wide as a pool (JAX's kernel broadcast the scales to one per layer, keys and values, every step)
    and no copy of a pool or scale pool anywhere in the decode; the KV pages read are 132/256 of bfloat16's."""
    w8, w8kv8 = decodes["w8"], decodes["w8kv8"]
    assert list(w8kv8["full_width"]) == []
    assert w8kv8["decode_step"]["kv_read_bytes"] == w8["decode_step"]["kv_read_bytes"] * 132 // 256


# The headline: QwQ-32B's rollout decode on its v6e workers (2x4, tensor-parallel 8) and on v5p (2x2x1,
# tensor-parallel 4), bfloat16 against int8 weights and pages, at the recipe's running sequences and
# mean context (docs/compile.md, "Eight-bit decode, compiled"). Four compiles of minutes each.
QWQ = "configs/qwq32b_code_tpu_1024.yaml"
V5P = ["hardware.rollout.chip=v5p", "hardware.rollout.chips_per_host=4", "hardware.rollout.hosts=192",
       "engine.tensor_parallel=4", "filter.generation.engine.tensor_parallel=4",
       "evaluate.generation.engine.tensor_parallel=4"]
INT8 = ["engine.weight_dtype=int8", "engine.cache_dtype=int8"]


@pytest.fixture(scope="module")
def qwq_decodes(tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    runs = {(chip, dtype): (V5P if chip == "v5p" else []) + (INT8 if dtype == "int8" else [])
            for chip in ("v5p", "v6e") for dtype in ("bf16", "int8")}

    def compile_one(key):
        report = run_compile(tmp_path_factory.mktemp("-".join(key)), QWQ, ["--roles", "rollout", "--programs",
                                                                           "decode", *runs[key]], timeout=1400)
        (decode,) = report["programs"]
        return key, decode

    with ThreadPoolExecutor(2) as pool:  # each compile is one process; two at a time
        return dict(pool.map(compile_one, runs))


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("chip", ["v5p", "v6e"])
def test_qwq_int8_decode_reads_its_pages_through_our_kernel_at_132_256_of_the_bfloat16_kv(qwq_decodes, chip):
    """int8 weights and pages against bfloat16 at the same running sequences and mean context: our
    kernel in every decode, no full-width copy of a pool, scale pool or weight anywhere in it, the
    pages read at 132/256 of bfloat16's (a byte and a 128th of a float32 row a number, against two),
    and the step's bytes (HBM's plus the pages) at most 0.6x bfloat16's, as issue 49 asks
    (docs/compile.md, "Eight-bit decode, compiled": 0.572x on v6e, 0.540x on v5p)."""
    bf16, int8 = qwq_decodes[chip, "bf16"], qwq_decodes[chip, "int8"]
    assert bf16["kernels"] == ["paged_attention"] and int8["kernels"] == ["eight_bit_paged_attention"]
    assert list(int8["full_width"]) == [], int8["full_width"][:4]
    a, b = bf16["decode_step"], int8["decode_step"]
    assert (a["running_sequences"], a["mean_context"]) == (b["running_sequences"], b["mean_context"])
    assert b["kv_read_bytes"] == a["kv_read_bytes"] * 132 // 256
    for report, step in ((bf16, a), (int8, b)):  # HBM's bytes, below XLA's count of the program as it runs
        assert step["xla_bytes"] == report["hbm_bytes_accessed"] < report["bytes_accessed"]
    ratio = b["step_bytes"] / a["step_bytes"]
    print(f"{chip}: int8 {b['step_bytes'] / 1e9:.2f} GB (XLA {b['xla_bytes'] / 1e9:.2f} + KV "
          f"{b['kv_read_bytes'] / 1e9:.2f}) against bfloat16 {a['step_bytes'] / 1e9:.2f} GB (XLA "
          f"{a['xla_bytes'] / 1e9:.2f} + KV {a['kv_read_bytes'] / 1e9:.2f}): {ratio:.3f}x")
    assert ratio <= 0.6
