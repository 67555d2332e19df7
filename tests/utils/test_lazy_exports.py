"""Packages hand out their names lazily (``rlax_core.utils.lazy_exports``): every name as before,
imported from its owner on first use, and a job that reads only configs imports no JAX."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from rlax_core.utils.lazy_exports import lazy_exports

LAZY_PACKAGES = ["rlax_core.inference", "rlax_core.models", "rlax_core.parallel", "rlax_core.rl",
                 "rlax_core.rollout", "rlax_core.weights"]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_is_its_owners_object(package):
    module = importlib.import_module(package)
    assert module.__all__, package
    for name in module.__all__:
        value = getattr(module, name)
        owner = getattr(value, "__module__", None)
        if owner and owner.startswith(package + "."):  # a class or function: the owner's own object
            assert getattr(importlib.import_module(owner), name) is value
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018


def test_a_name_is_imported_from_its_owner_on_first_use():
    getattr_, dir_, all_ = lazy_exports("json", {"decoder": ["JSONDecodeError"]})
    assert all_ == ["JSONDecodeError"] and "JSONDecodeError" in dir_()
    assert getattr_("JSONDecodeError") is importlib.import_module("json.decoder").JSONDecodeError
    with pytest.raises(AttributeError):
        getattr_("loads_everything")


@pytest.mark.parametrize("module", ["pipelines.curate", "pipelines.config", "pipelines.cli"])
def test_a_job_that_reads_configs_imports_no_jax(module):
    # rlax curate builds no model: JAX's import (about a second of a quickstart's curate stage) is not its
    # to pay. Loading the quickstart's run config validates every section, the algorithm's estimator too.
    code = (f"import sys, {module}; from pipelines.config import load_run_config; "
            "load_run_config('configs/quickstart.yaml', []); "
            "print(sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
