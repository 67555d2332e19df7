"""Shared test fixtures.

JAX runs on CPU with 8 simulated devices so that sharding tests run in-process; the flag must be set
before JAX is first imported, which is why it lives here.
"""
import os

import importlib.util

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

# The TPU and GPU compile lanes' environments (libtpu, jax's CUDA plugin) compile for chips this host
# lacks, ahead of time: those programs are compiled once each, as a chip would run them.
_COMPILES_FOR_OTHER_CHIPS = any(importlib.util.find_spec(name) for name in ("libtpu", "jax_cuda12_plugin"))

# The lane's CPU time is mostly XLA compiling many tiny programs that then run for milliseconds; LLVM's
# optimisation of the generated code is a third of it (tests/training/test_step.py and test_rm_job.py's
# default tests, idle: 74 s of CPU with it, 51 s without). The programs' HLO is the same; the machine code rounds some
# sums in another order (the toy models' log-probs move by about 1e-7 of their value), which the tests'
# tolerances allow: they come from the arithmetic (tests/support/tolerances.py), not from one code
# generator. An XLA_FLAGS that names the level keeps its own. The slow lane keeps LLVM's optimisation
# (RLAX_TEST_UNOPTIMISED_CPU_CODE=0, the Makefile's test-slow): its time is in running, not compiling,
# and in three runs of it an xdist worker crashed (SIGSEGV) inside XLA:CPU compiling or serialising a
# training step at level 0, each time a test that passes alone; the lanes before level 0 never did.
#
# For the same reason the default lane emits fusions with XLA:CPU's elemental emitters instead of its
# MLIR fusion emitters (--xla_cpu_use_fusion_emitters=false), which cost most of what is left of a tiny
# program's compile. Idle, each test alone (`pytest TEST`, one run each way, not interleaved), CPU
# seconds: test_step's fused-projections step 13.7 -> 8.7, the 4-device expert-parallel replica
# 13.8 -> 10.0, the word-chain episodes 11.3 -> 8.5. The same HLO; an XLA_FLAGS that names the flag
# keeps its own.
if (not _COMPILES_FOR_OTHER_CHIPS and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
        and os.environ.get("RLAX_TEST_UNOPTIMISED_CPU_CODE", "1") != "0"):
    os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"] + " --xla_backend_optimization_level=0"
    if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"] + " --xla_cpu_use_fusion_emitters=false"

# One persistent compilation cache for the lane's processes (xdist workers and the jobs tests start):
# many tests compile the same small programs from different closures, which JAX's in-memory caches
# do not share. A fresh folder per run, so a run's time is a fresh clone's. Tests that count
# compilations count the cache's hits as well (tests/support/compiles.py).
import tempfile

# The other chips' programs are left out of the cache.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and not _COMPILES_FOR_OTHER_CHIPS:
    _run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"rlax-test-jax-cache-{_run_id}")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]  # this process made it: it removes it at the end
else:
    _OWN_CACHE = None


def pytest_unconfigure(config):
    if _OWN_CACHE and "PYTEST_XDIST_WORKER" not in os.environ:
        import shutil

        shutil.rmtree(_OWN_CACHE, ignore_errors=True)

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Small copies of real datasets and tokenizers (tests/fixtures/README.md lists them and their licences)."""
    return FIXTURES / "data"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """Outputs of Hugging Face transformers for the model and tokenizer tests."""
    return FIXTURES / "golden"


@pytest.fixture(scope="session")
def stories260k_dir() -> Path:
    """The quickstart's pretrained model as the package ships it (llama2.c checkpoint + SentencePiece)."""
    return REPO_ROOT / "pipelines" / "assets" / "stories260K"

# The GCS emulator fixture (``gcs_emulator``) for gs:// tests; the repository root must be importable
# for pytest to load it by module name under importlib import mode.
import sys as _sys

if str(REPO_ROOT) not in _sys.path:
    _sys.path.insert(0, str(REPO_ROOT))
pytest_plugins = ["tests.support.gcs_emulator"]
