"""The GPU lane without a GPU: recipes' programs compiled for NVIDIA GPUs by jax's CUDA plugin here.

Runs in the lock-gpu environment (``make test-gpu-compile`` builds it: the worker image's packages
less the CUDA runtime wheels a compile never loads, plus this package). ``rlax compile`` compiles
from XLA's target description of each GPU (``rlax_core/compile/gpu_targets``):

- the small Qwen2-shaped recipe with its engine and trainer each on one H100, then with the engine
  tensor-parallel over a host's 8 H100s and the trainer FSDP over them;
- every role of the two GPU recipes: ``qwen25_1p5b_math_dataflow_gpu.yaml`` (engines on one L4, the
  trainer FSDP over 8 x A100 40GB) and ``filter_dataflow_gpu.yaml`` (the filter's L4 engine);
- the 7B GPU recipe's trainer on one 8 x H100 host, with its engine's smallest prefill and decode.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.rlax_compile import run_compile

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SMALL = "tests/fixtures/compile/small_qwen2_gpu.yaml"
ONE_GPU = ["hardware.trainer.chips_per_host=1", "trainer.mesh.fsdp=1"]  # the engine is on one H100 as written
EIGHT_GPUS = ["engine.tensor_parallel=8", "hardware.rollout.chips_per_host=8"]  # the trainer: fsdp 8, as written
RECIPE_1P5B = "configs/qwen25_1p5b_math_dataflow_gpu.yaml"
RECIPE_FILTER = "configs/filter_dataflow_gpu.yaml"
RECIPE_7B = "configs/qwen25_7b_math_dataflow_gpu.yaml"
GIB = 2**30


@pytest.fixture(scope="module")
def small_one_gpu(tmp_path_factory):
    return run_compile(tmp_path_factory.mktemp("small-1"), SMALL, ONE_GPU)


@pytest.fixture(scope="module")
def small_eight_gpus(tmp_path_factory):
    return run_compile(tmp_path_factory.mktemp("small-8"), SMALL, EIGHT_GPUS)


@pytest.fixture(scope="module")
def recipe_1p5b(tmp_path_factory):
    return run_compile(tmp_path_factory.mktemp("1p5b"), RECIPE_1P5B, [], timeout=1800)


@pytest.fixture(scope="module")
def recipe_filter(tmp_path_factory):
    return run_compile(tmp_path_factory.mktemp("filter"), RECIPE_FILTER, [], timeout=1800)


@pytest.fixture(scope="module")
def recipe_7b(tmp_path_factory):
    return run_compile(tmp_path_factory.mktemp("7b"), RECIPE_7B,
                       ["--roles", "rollout,trainer", "--programs", "prefill 8x256,decode,update step"], timeout=1800)


def _programs(report: dict) -> dict[tuple[str, str], dict]:
    return {(p["role"], p["program"]): p for p in report["programs"]}


def test_the_package_and_the_gpu_compiler_import_in_the_worker_images_environment():
    done = subprocess.run([sys.executable, "-c", "import jax, jax_plugins.xla_cuda12, rlax_core, transforms, pipelines; "
                           "from jax._src.lib import cuda_versions; print(jax.__version__, cuda_versions.cudnn_get_version())"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("which, rollout, trainer", [("small_one_gpu", "h100:1x1x1", "h100:1x1x1"),
                                                     ("small_eight_gpus", "h100:1x1x8", "h100:1x1x8")])
def test_every_program_of_the_small_recipe_compiles_for_one_and_eight_gpus(which, rollout, trainer, request):
    programs = _programs(request.getfixturevalue(which))
    assert [p for p in programs.values() if not p["compiled"]] == []
    assert sorted(name for role, name in programs if role == "rollout") == [
        "decode 8 slots x 16 steps (gpu)", "prefill 4x128", "prefill 4x64"]
    assert {p["topology"] for (role, _), p in programs.items() if role == "rollout"} == {rollout}
    assert programs["trainer", "update step"]["topology"] == trainer
    for program in programs.values():  # XLA's accounting came back: bytes per GPU, FLOPs, a roofline
        assert program["argument_bytes"] > 0 and program["flops"] > 0 and program["roofline_s"] > 0
        assert program["peak_bytes"] < 80 * GIB


@pytest.mark.parametrize("which", ["small_one_gpu", "small_eight_gpus"])
def test_attention_is_cudnns_in_prefill_and_training_and_a_triton_kernel_in_decode(which, request):
    """A dense fall-back, or a kernel in interpret mode, leaves no cuDNN or Triton call in the HLO."""
    kernels = {name: p["kernels"] for (_, name), p in _programs(request.getfixturevalue(which)).items()}
    assert kernels["prefill 4x64"] == kernels["prefill 4x128"] == ["cudnn:fmhaScaleBiasSoftmax"]
    (decode,) = kernels["decode 8 slots x 16 steps (gpu)"]
    assert decode.startswith("paged_attention")
    assert kernels["update step"] == ["cudnn:fmhaScaleBiasSoftmax", "cudnn:fmhaScaleBiasSoftmaxBackward"]


def test_the_tensor_parallel_engine_holds_an_eighth_of_the_weights(small_one_gpu, small_eight_gpus):
    """Query heads, MLP columns and vocabulary split over 8 GPUs; the 4 KV heads do not divide 8, so
    the k and v projections and the pool stay whole on each: decode's arguments drop by 7/8 of the
    split weights."""
    def decode(report):
        return next(p for p in report["programs"] if p["program"].startswith("decode"))["argument_bytes"]

    embed, split_layer = 2048 * 512, (1024 + 1024) * 512 + 3 * 512 * 1024  # q, o and the MLP
    split = 2 * (2 * embed + 2 * split_layer)  # bfloat16, untied embed and lm_head, 2 layers
    dropped = decode(small_one_gpu) - decode(small_eight_gpus)
    assert 0.99 * split * 7 / 8 < dropped < 1.01 * split * 7 / 8


def test_the_eight_gpu_trainer_compiles_with_fused_attention_and_its_bytes_fit(recipe_1p5b):
    """The 1.5B recipe's trainer as written: FSDP over 8 x A100 40GB. JAX's cuDNN partitioner refused
    it ("Query, key and value should have same sharding") before attention ran under shard_map; with
    dense attention it needed 36 GiB of temporaries per GPU, over the 40 GiB with its state."""
    trainer = _programs(recipe_1p5b)["trainer", "update step"]
    assert trainer["compiled"] and trainer["topology"] == "a100-40gb:1x1x8"
    assert trainer["kernels"] == ["cudnn:fmhaScaleBiasSoftmax", "cudnn:fmhaScaleBiasSoftmaxBackward"]
    assert trainer["peak_bytes"] < 40 * GIB * 0.9  # the planner's usable share of the GPU
    assert trainer["temp_bytes"] < 8 * GIB


@pytest.mark.parametrize("which, roles, gpu", [("recipe_1p5b", {"rollout", "filter", "evaluate", "trainer"}, None),
                                               ("recipe_filter", {"filter"}, "l4:1x1x1")])
def test_every_role_of_the_gpu_recipes_compiles_within_its_gpus(which, roles, gpu, request):
    report = request.getfixturevalue(which)
    assert [p for p in report["programs"] if not p["compiled"]] == []
    assert set(report["roles"]) == roles
    for role, figures in report["roles"].items():
        assert figures["xla_bytes_per_chip"] <= figures["hbm_bytes_per_chip"], role
    engines = [p for p in report["programs"] if p["role"] != "trainer"]
    assert {p["topology"] for p in engines} == {gpu or "l4:1x1x1"}
    assert all(p["kernels"] for p in engines), [p["program"] for p in engines if not p["kernels"]]


@pytest.mark.parametrize("which", ["recipe_1p5b", "recipe_filter", "recipe_7b"])
def test_the_planner_is_within_15_percent_of_xla_on_the_safe_side_for_every_gpu_recipe_role(which, request):
    for role, figures in request.getfixturevalue(which)["roles"].items():
        ratio = figures["planned_bytes_per_chip"] / figures["xla_bytes_per_chip"]
        assert 1.0 <= ratio <= 1.15, f"{which} {role}: planner / XLA = {ratio:.3f} ({figures})"


def test_the_7b_recipe_compiles_on_one_8_x_h100_host(recipe_7b):
    programs = _programs(recipe_7b)
    assert [p for p in programs.values() if not p["compiled"]] == []
    trainer = programs["trainer", "update step"]
    assert trainer["topology"] == "h100:1x1x8" and trainer["peak_bytes"] < 80 * GIB * 0.9
    assert trainer["kernels"] == ["cudnn:fmhaScaleBiasSoftmax", "cudnn:fmhaScaleBiasSoftmaxBackward"]
    assert {p["topology"] for (role, _), p in programs.items() if role == "rollout"} == {"a100-80gb:1x1x1"}
