"""The TPU lane without a TPU: a small Qwen2-shaped recipe's programs compiled by libtpu on this host.

Runs in the lock-tpu environment (``make test-tpu-compile`` builds it: the worker image's packages
plus this one, as the image installs them). ``rlax compile`` compiles the engine tensor-parallel
over a v5e 2x2 host and the trainer FSDP over a v5p 2x2x1 host, then, with the chips swapped by
overrides, the engine on v5p and the trainer tensor-parallel over v5e.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.rlax_compile import run_compile

pytestmark = pytest.mark.tpu

REPO = Path(__file__).resolve().parents[2]
RECIPE = "tests/fixtures/compile/small_qwen2_tpu.yaml"
SWAPPED = ["hardware.rollout.chip=v5p", "hardware.trainer.chip=v5e", "trainer.mesh.fsdp=1", "trainer.mesh.tensor=4"]


def _compile(tmp_path_factory, name: str, overrides: list[str]) -> dict:
    return run_compile(tmp_path_factory.mktemp(name), RECIPE, overrides)


@pytest.fixture(scope="module")
def tp_v5e_fsdp_v5p(tmp_path_factory):
    return _compile(tmp_path_factory, "v5e-tp", [])


@pytest.fixture(scope="module")
def tp_v5p_tensor_v5e(tmp_path_factory):
    return _compile(tmp_path_factory, "v5p-tp", SWAPPED)


def test_the_package_imports_in_the_worker_images_environment():
    done = subprocess.run([sys.executable, "-c", "import jax, libtpu, rlax_core, transforms, pipelines; "
                           "print(jax.__version__)"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("which", ["tp_v5e_fsdp_v5p", "tp_v5p_tensor_v5e"])
def test_every_program_of_the_small_recipe_compiles_for_its_slice(which, request):
    report = request.getfixturevalue(which)
    programs = {(p["role"], p["program"]): p for p in report["programs"]}
    assert [p for p in programs.values() if not p["compiled"]] == []
    engine_chip, trainer_chip = ("v5e", "v5p") if which == "tp_v5e_fsdp_v5p" else ("v5p", "v5e")
    topologies = {"v5e": "v5e:2x2", "v5p": "v5p:2x2x1"}
    assert {p["topology"] for p in programs.values() if p["role"] == "rollout"} == {topologies[engine_chip]}
    assert programs["trainer", "update step"]["topology"] == topologies[trainer_chip]
    names = sorted(name for role, name in programs if role == "rollout")
    assert names == ["decode 8 slots x 16 steps (tpu)", "prefill 4x128", "prefill 4x64"]
    for program in programs.values():  # XLA's own accounting came back: bytes per chip, FLOPs, a roofline
        assert program["argument_bytes"] > 0 and program["flops"] > 0 and program["roofline_s"] > 0
        assert program["peak_bytes"] < 16 * 2**30


@pytest.mark.parametrize("which", ["tp_v5e_fsdp_v5p", "tp_v5p_tensor_v5e"])
def test_the_pallas_kernels_are_lowered_through_mosaic_not_interpreted(which, request):
    """Interpret mode, or a fall-back to the jnp reference, leaves no ``tpu_custom_call`` in the HLO:
    decode's paged attention, the prefill's and the trainer's splash attention (forward, and the
    trainer's backward kernels) are each one. A 64-token bucket is not a multiple of the kernel's
    128-token tiles: that prefill is dense by rule."""
    kernels = {p["program"]: p["kernels"] for p in request.getfixturevalue(which)["programs"]}
    assert kernels["decode 8 slots x 16 steps (tpu)"] == ["paged_attention"]
    assert kernels["prefill 4x64"] == []
    assert [name for name in kernels["prefill 4x128"] if name.startswith("splash_mqa_fwd")]
    trainer = kernels["update step"]
    assert [name for name in trainer if name.startswith("splash_mqa_fwd")], trainer
    assert [name for name in trainer if name.startswith(("splash_mqa_dkv", "splash_mqa_dq"))], trainer


def test_the_compiled_tensor_parallel_engine_holds_a_quarter_of_the_weights(tp_v5e_fsdp_v5p):
    """2 layers' and the embeddings' bfloat16 weights split by heads, MLP columns and vocabulary over 4 chips:
    the decode program's arguments are those plus a quarter of the KV pool and the slot state."""
    decode = next(p for p in tp_v5e_fsdp_v5p["programs"] if p["program"].startswith("decode"))
    embed, layer = 2048 * 512, (1024 + 512 + 512 + 1024) * 512 + 3 * 512 * 1024  # q, k, v, o + the MLP
    weights = 2 * (2 * embed + 2 * layer) // 4  # untied embed and lm_head
    pool = 2 * 2 * 4 * 256 * 16 * 128 * 2 // 4  # layers x (k, v) x KV heads x pages x page size x head_dim x bf16 / 4
    assert weights + pool < decode["argument_bytes"] < 1.05 * (weights + pool) + 64 * 1024


@pytest.mark.parametrize("which, most", [("tp_v5e_fsdp_v5p", 1.25), ("tp_v5p_tensor_v5e", 1.6)])
def test_the_planner_is_on_the_safe_side_of_xla_for_every_role(which, most, request):
    """Planned bytes per chip at least XLA's for every role, and not far above: within 25% for the
    recipe as written (engine tensor-parallel over v5e, trainer FSDP over v5p; its engine holds 16 MiB,
    of which the 4 MiB the planner counts for a program's code and fixed scratch is a quarter: 1.21x). With the chips
    swapped the tensor-parallel trainer's plan is 1.56x XLA's (docs/compile.md): far on the safe side."""
    roles = request.getfixturevalue(which)["roles"]
    assert set(roles) == {"rollout", "trainer"}
    for role, figures in roles.items():
        ratio = figures["planned_bytes_per_chip"] / figures["xla_bytes_per_chip"]
        assert 1.0 <= ratio <= most, f"{role}: planner / XLA = {ratio:.2f} ({figures})"


# The evaluate engine of the rollout engine's configuration, sampling with top-p (the rollout samples
# with temperature alone): its prefills are the rollout's, its decode is its own.
EVALUATE_TOP_P = ["evaluate.models=[tests/fixtures/compile/small_qwen2]", "evaluate.generation.temperature=0.6",
                  "evaluate.generation.top_p=0.95", "evaluate.generation.max_new_tokens=384",
                  "evaluate.generation.dtype=bfloat16",
                  *[f"evaluate.generation.engine.{key}" for key in (
                      "num_slots=8", "page_size=16", "num_pages=256", "max_prompt_len=128", "max_new_tokens=384",
                      "prefill_buckets=[64,128]", "max_prefill_batch=4", "attention_impl=pallas",
                      "cache_dtype=bfloat16", "tensor_parallel=4", "on_new_version=drain")]]


def test_an_engine_that_samples_differently_shares_the_prefills_and_a_subset_compiles_alone(tmp_path_factory):
    report = _compile(tmp_path_factory, "evaluate", ["--roles", "rollout,evaluate", "--programs",
                                                     "prefill 4x64,decode", *EVALUATE_TOP_P])
    programs = {(p["role"], p["program"]): p for p in report["programs"]}
    assert sorted(programs) == [("evaluate", "decode 8 slots x 16 steps (tpu)"), ("evaluate", "prefill 4x64"),
                                ("rollout", "decode 8 slots x 16 steps (tpu)"), ("rollout", "prefill 4x64")]
    assert report["programs_asked"] == ["prefill 4x64", "decode"]
    shared, own = programs["evaluate", "prefill 4x64"], programs["evaluate", "decode 8 slots x 16 steps (tpu)"]
    assert shared == dict(programs["rollout", "prefill 4x64"], role="evaluate")  # the same report, not a compile
    assert own["compiled"] and own["compile_s"] != programs["rollout", "decode 8 slots x 16 steps (tpu)"]["compile_s"]
    assert "pipelines.compile: compiling evaluate: prefill" not in report["stderr"]
    assert "pipelines.compile: compiling evaluate: decode" in report["stderr"]


def test_a_decode_with_two_kv_heads_per_chip_never_copies_its_kv_pool():
    """The token write (``kv_cache.write_pages``) scatters rows of one KV head, the heads a batch
    dimension, so the pool keeps the layout the paged-attention kernel reads. Written with the heads
    as part of each update, XLA laid the loop-carried pool out heads-inner for the scatter and copied
    every layer's whole pool back for the kernel at every step: on QwQ-32B with 2 KV heads per v5p
    chip, 16 GiB of temporaries and 131 GB read per step (docs/fleet.md); with 1 head per chip the
    two layouts coincide."""
    import re

    from pipelines.config import load_run_config
    from pipelines.config import template_of
    from rlax_core.compile.programs import engine_programs
    from rlax_core.compile.topology import slice_devices
    from rlax_core.inference.sampling import SamplingMode
    from rlax_core.models.checkpoint import read_model_config

    config = load_run_config(REPO / RECIPE, ["engine.tensor_parallel=2"])  # 4 KV heads: 2 per chip
    model = read_model_config(template_of(config.model.resolved_path()))
    (decode,) = [program for program in engine_programs(model, config.engine, config.model.dtype,
                                                        slice_devices("v5e", 4, 4), SamplingMode.TEMPERATURE)
                 if program.name.startswith("decode")]
    text = decode.lower().compile().as_text()
    pool = f"bf16[2,{config.engine.num_pages},{config.engine.page_size},{model.head_dim}]"  # one layer's, per chip
    assert re.search(re.escape(pool) + r"\{3,2,1,0", text), "no pool in the kernel's layout"
    copies = re.findall(re.escape(pool) + r"\{[^}]*\} copy\(", text)
    assert copies == [], f"{len(copies)} copies of a whole KV pool in the decode program"
