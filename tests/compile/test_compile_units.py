"""The parts of ``rlax compile`` that need no TPU or GPU compiler: slice names, GPU target
descriptions, kernel names, XLA's cost analysis, rooflines, and the one-line refusals where a
compiler is missing (the ordinary environment)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlax_core.compile.report import compiled_kernels, mosaic_kernels, roofline_seconds
from rlax_core.compile.topology import host_bounds, topology_name
from rlax_core.config import ConfigError
from rlax_core.planning.hardware import CHIP_PEAKS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("chip, chips, name", [
    ("v5e", 1, "v5e:1x1"), ("v5e", 4, "v5e:2x2"), ("v6e", 8, "v6e:2x4"), ("v5e", 256, "v5e:16x16"),
    ("v5p", 4, "v5p:2x2x1"), ("v5p", 16, "v5p:2x2x4"), ("v5p", 256, "v5p:4x8x8"), ("v5p", 1024, "v5p:8x8x16"),
])
def test_a_roles_chips_map_to_the_slice_cloud_tpu_sells(chip, chips, name):
    assert topology_name(chip, chips) == name


@pytest.mark.parametrize("chip, chips, per_host, name", [
    ("l4", 1, 1, "l4:1x1x1"), ("h100", 8, 8, "h100:1x1x8"), ("a100-40gb", 16, 8, "a100-40gb:1x2x8"),
    ("h200", 4, None, "h200:1x1x4"),
])
def test_a_roles_gpus_map_to_hosts_of_gpus(chip, chips, per_host, name):
    assert topology_name(chip, chips, per_host) == name


def test_slices_that_do_not_exist_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match="power of two"):
        topology_name("v5p", 12)
    with pytest.raises(ConfigError, match="compiles for TPU slices .* and NVIDIA GPUs .*; a cpu role compiles as it starts"):
        topology_name("cpu", 8)
    with pytest.raises(ConfigError, match="12 GPUs on hosts of 8: a GPU slice is whole hosts"):
        topology_name("h100", 12, 8)
    with pytest.raises(ConfigError, match="holds 4 chips, not 8"):
        host_bounds("v5p", 8)


def test_every_gpu_chip_the_planner_knows_has_a_target_description_with_its_source():
    """A GPU of ``CHIP_MEMORY_GIB`` compiles from a vendored XLA target spec (or one derived from
    such a spec, which says so): each parses as text, names its device and keeps XLA's licence."""
    from rlax_core.compile.gpu import GPU_TARGETS, TARGETS_DIR, target_config
    from rlax_core.planning.hardware import CHIP_MEMORY_GIB, platform_of

    assert sorted(GPU_TARGETS) == sorted(chip for chip in CHIP_MEMORY_GIB if platform_of(chip) == "gpu")
    for chip, target in GPU_TARGETS.items():
        raw = (TARGETS_DIR / target.file).read_text()
        assert "Licensed under the Apache License, Version 2.0" in raw and "openxla/xla/blob/" in raw
        assert ("Vendored by rlax-beam" in raw) != ("Derived by rlax-beam" in raw)
        assert "device_description_str:" in raw and "gpu_device_info {" in raw
        assert target.source.startswith(("XLA's target spec", "derived: XLA's"))
        text = target_config(chip)
        assert text.count("dnn_version_info {") == 1 and text.count("{") == text.count("}")
    with pytest.raises(ConfigError, match="no GPU target description for 'b200'"):
        target_config("b200")


def test_mosaic_kernels_are_named_once_each_from_the_compiled_hlo():
    hlo = """
  %paged_attention.2 = (f32[8,2,1,128]) custom-call(%a, %b), custom_call_target="tpu_custom_call", backend_config={}
  %fusion.1 = f32[8] fusion(%a), kind=kLoop
  %concat = f32[8] custom-call(%a), custom_call_target="ConcatBitcast"
  ROOT %splash_mqa_fwd_segmented.1 = (f32[2]) custom-call(%q), custom_call_target="tpu_custom_call"
  %paged_attention.7 = (f32[8,2,1,128]) custom-call(%a, %b), custom_call_target="tpu_custom_call"
"""
    assert mosaic_kernels(hlo) == ("paged_attention", "splash_mqa_fwd_segmented")
    assert mosaic_kernels(hlo.replace("tpu_custom_call", "interpreted")) == ()


def test_gpu_kernels_are_named_from_cudnn_and_triton_calls_in_the_compiled_hlo():
    hlo = r"""
  %dot_product_attention_fwd.4 = (bf16[4,8,64,128]{3,1,2,0}, u8[0]{0}) custom-call(%a, %b, %c), custom_call_target="__cudnn$fmhaScaleBiasSoftmax", backend_config={}
  %dot_product_attention_bwd.2 = (bf16[1,8,512,128]) custom-call(%a), custom_call_target="__cudnn$fmhaScaleBiasSoftmaxBackward"
  %pallas_call.8 = (bf16[8,16,4,16,128]) custom-call(%q, %k), custom_call_target="__gpu$xla.gpu.triton", backend_config={debug = false, grid_x = 4 : i32, ir = "ML\EFR\0D", name = "paged_attention_block_h_16_pages_per_compute_block_2", num_stages = 2 : i32}
  %pallas_call.12 = (bf16[8,16,4,16,128]) custom-call(%q, %k), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "paged_attention_block_h_16_pages_per_compute_block_2"}
  %cublas = f32[8] custom-call(%a), custom_call_target="__cublas$gemm"
"""
    assert compiled_kernels(hlo) == ("cudnn:fmhaScaleBiasSoftmax", "cudnn:fmhaScaleBiasSoftmaxBackward",
                                     "paged_attention_block_h_16_pages_per_compute_block_2")
    assert compiled_kernels(hlo.replace("__cudnn$", "").replace("__gpu$xla.gpu.triton", "interpreted")) == ()


def test_the_roofline_is_the_slower_of_compute_and_memory():
    peak = CHIP_PEAKS["v5e"]
    assert roofline_seconds("v5e", peak.bf16_flops, 0) == pytest.approx(1.0)  # compute bound
    assert roofline_seconds("v5e", 1.0, 2 * peak.hbm_bytes_per_s) == pytest.approx(2.0)  # memory bound
    assert roofline_seconds("cpu", 1.0, 1.0) is None
    assert all(p.source.startswith("https://") for p in CHIP_PEAKS.values())


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is not None, reason="libtpu is here: the tpu lane compiles")
def test_without_libtpu_rlax_compile_says_where_the_tpu_compiler_is():
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "compile", "--config",
                           "tests/fixtures/compile/small_qwen2_tpu.yaml"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "rlax compile: config error" in done.stderr and "make setup-tpu-compile" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is not None, reason="the GPU compiler is here")
def test_without_the_cuda_plugin_rlax_compile_says_where_the_gpu_compiler_is():
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "compile", "--config",
                           "tests/fixtures/compile/small_qwen2_gpu.yaml"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "rlax compile: config error: hardware: no GPU compiler for h100:1x1x1" in done.stderr
    assert "make setup-gpu-compile" in done.stderr and "Traceback" not in done.stderr


def test_an_unsupported_chip_is_refused_in_one_line():
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "compile", "--config",
                           "tests/fixtures/compile/small_qwen2_gpu.yaml", "hardware.trainer.chip=b200"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "rlax compile: config error: hardware.trainer.chip: unknown chip 'b200'; known: a100-40gb, a100-80gb, h100, h200, l4, "
        "v4, v5e, v5p, v6e, cpu")


def test_a_cpu_role_is_not_compiled_ahead_of_time_and_says_so_in_one_line(tmp_path):
    """The quickstart's roles run on CPU devices: each gets one line, and nothing fails."""
    out = tmp_path / "compile.json"
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "compile", "--config", "configs/quickstart.yaml",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    programs = json.loads(out.read_text())["programs"]
    assert {p["role"] for p in programs} >= {"rollout", "trainer"}
    for p in programs:
        assert not p["compiled"] and p["topology"] == "-"
        assert p["error"] == ("not compiled: rlax compile compiles for TPU slices (v4, v5e, v5p, v6e) and NVIDIA "
                              "GPUs (a100-40gb, a100-80gb, h100, h200, l4); a cpu role compiles as it starts, on its "
                              "own devices")


def test_the_qwq_trainer_holds_32k_rows_with_splash_attention_and_not_with_dense(capsys):
    """docs/memory.md's two commands: the paper's 32,768-token rows on a v5p chip, dense vs splash."""
    from pipelines.cli import main

    recipe = "configs/qwq32b_code_tpu_1024.yaml"
    assert main(["plan", "--config", recipe, "trainer.attention=dense"]) == 1
    dense = capsys.readouterr().out
    assert main(["plan", "--config", recipe]) == 0
    splash = capsys.readouterr().out
    assert "trainer: QwQ-32B on 256 x v5p" in dense and "total 91.25 GiB" in dense and "activations 88.84 GiB" in dense
    assert "total 33.87 GiB" in splash and "activations 31.46 GiB" in splash


@pytest.mark.parametrize("tensor_parallel", [1, 2])
@pytest.mark.parametrize("lora_mode", ["on_the_fly", "merged"])
def test_the_compiled_engine_params_are_what_an_engine_holds_after_update_adapters(tensor_parallel, lora_mode):
    """``rlax compile`` lowers a LoRA run's rollout programs for the weights a real engine holds once
    an adapter version is applied: the same tree, shapes, dtypes and shardings."""
    import jax
    import numpy as np

    from rlax_core.compile.programs import engine_params
    from rlax_core.inference.config import EngineConfig
    from rlax_core.inference.engine import Engine
    from rlax_core.models.config import ModelConfig
    from rlax_core.models.lora import init_adapters
    from rlax_core.models.lora_config import LoraConfig
    from rlax_core.models.transformer import init_params

    model = ModelConfig(architecture="qwen2", qkv_bias=True, vocab_size=256, hidden_size=64, intermediate_size=128,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=128,
                        eos_token_ids=(2,))
    # q and v but not k, gate but not up: on one device the fused adapters carry zero blocks.
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "gate", "down"))
    config = EngineConfig(num_slots=2, page_size=8, num_pages=8, max_prompt_len=16, max_new_tokens=8,
                          prefill_buckets=(16,), tensor_parallel=tensor_parallel, lora_mode=lora_mode)
    devices = jax.devices()[1:2] if tensor_parallel == 1 else jax.devices()[:tensor_parallel]
    place = dict(device=devices[0]) if tensor_parallel == 1 else dict(devices=devices)
    engine = Engine(config, model, init_params(model, jax.random.key(0), np.float32), **place)
    engine.update_adapters(init_adapters(model, lora, jax.random.key(1)), lora, version=1)

    held = jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), engine.params)
    compiled = jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), engine_params(model, config, "float32", devices, lora))
    assert jax.tree.structure(compiled) == jax.tree.structure(held)
    assert jax.tree.leaves(compiled, is_leaf=lambda x: isinstance(x, tuple)) == \
        jax.tree.leaves(held, is_leaf=lambda x: isinstance(x, tuple))
    if lora_mode == "on_the_fly":
        assert any("lora_a" in str(path) for path, _ in jax.tree_util.tree_leaves_with_path(engine.params))
