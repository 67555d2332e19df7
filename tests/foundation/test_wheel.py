"""The wheel, built from the sdist as pip builds it, installed into a fresh virtual environment outside
the checkout: ``rlax`` runs its commands from another folder, finding its recipes and model inside the
package."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is not installed (make setup installs it into .venv)")
    return found


def _run(command: list[str], cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
    return done


@pytest.mark.slow  # builds and installs (about a minute from uv's cache), then loads a model
def test_wheel_from_the_sdist_runs_rlax_from_any_folder(tmp_path):
    dist, elsewhere = tmp_path / "dist", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)], cwd=REPO)
    (sdist,) = dist.glob("rlax[-_]beam-*.tar.gz")
    _run([_uv(), "build", "--wheel", "--offline", "--out-dir", str(dist), str(sdist)], cwd=tmp_path)
    (wheel,) = dist.glob("rlax_beam-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "*.py", "pipelines/assets", "configs/*.yaml",
                              "rlax_core/compile/gpu_targets"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    packaged = [name for name in tracked if name.split("/")[0] in ("rlax_core", "transforms", "pipelines", "configs")]
    wanted = {f"pipelines/{name}" if name.startswith("configs/") else name for name in packaged if (REPO / name).exists()}
    assert not sorted(wanted - names), f"the wheel lacks: {sorted(wanted - names)}"

    venv = tmp_path / "venv"
    _run([_uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=tmp_path)
    _run([_uv(), "pip", "install", "--quiet", "--offline", "-p", str(venv / "bin" / "python"),
          "-r", str(REPO / "requirements" / "lock.txt"), str(wheel)], cwd=tmp_path, timeout=900)

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    rlax = str(venv / "bin" / "rlax")
    version = _run([rlax, "--version"], cwd=elsewhere, env=env).stdout
    assert version.startswith("rlax 0.") and str(venv) in version, version  # the installed package, not the checkout
    assert "quickstart" in _run([rlax, "--help"], cwd=elsewhere, env=env).stdout
    assert "--output" in _run([rlax, "quickstart", "--help"], cwd=elsewhere, env=env).stdout
    story = _run([rlax, "generate", "--model", "assets:stories260K", "--prompt", "Once upon a time",
                  "--max-new-tokens", "12"], cwd=elsewhere, env=env, timeout=600).stdout
    assert story.startswith(", there was a little girl named Lily"), story  # stories260K's greedy continuation
    # A recipe by its name, read from inside the package: a bad override names its key, found in that recipe.
    bad = subprocess.run([rlax, "train", "--config", "configs/quickstart.yaml", "trainer.total_steps=many"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "trainer.total_steps" in bad.stderr, bad.stderr[-2000:]
