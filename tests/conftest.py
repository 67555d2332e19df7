"""Shared test fixtures.

JAX runs on CPU with 8 simulated devices so that sharding tests run in-process; the flag must be set
before JAX is first imported, which is why it lives here.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

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
