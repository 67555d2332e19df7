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


def _shared_dir() -> Path:
    return Path(os.environ.get("RLAX_SHARED_DIR", REPO_ROOT.parent / "shared")).resolve()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ``../shared`` folder beside the checkout (real data, golden outputs)."""
    path = _shared_dir()
    if not (path / "data").is_dir():
        pytest.fail(f"shared data not found at {path}; set RLAX_SHARED_DIR to the folder holding data/ and golden/")
    return path


@pytest.fixture(scope="session")
def shared_data(shared_dir) -> Path:
    return shared_dir / "data"


@pytest.fixture(scope="session")
def golden_dir(shared_dir) -> Path:
    return shared_dir / "golden"

# The GCS emulator fixture (``gcs_emulator``) for gs:// tests; the repository root must be importable
# for pytest to load it by module name under importlib import mode.
import sys as _sys

if str(REPO_ROOT) not in _sys.path:
    _sys.path.insert(0, str(REPO_ROOT))
pytest_plugins = ["tests.support.gcs_emulator"]
