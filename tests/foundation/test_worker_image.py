"""The Dataflow worker image: Beam's SDK base image of the pinned Beam version, pinned JAX extras, a clear make target."""

import re
import shutil
import subprocess
from pathlib import Path

import apache_beam
import pytest

REPO = Path(__file__).resolve().parents[2]


def _pins(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock.read_text(), flags=re.M))


def test_the_image_starts_from_beams_sdk_image_of_the_pinned_beam_version():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    version = re.search(r"^ARG BEAM_VERSION=(\S+)", dockerfile, flags=re.M).group(1)
    assert version == apache_beam.__version__ == _pins(REPO / "requirements" / "lock.txt")["apache-beam"]
    assert "FROM apache/beam_python3.11_sdk:${BEAM_VERSION}" in dockerfile
    assert "requirements/lock-${ACCELERATOR}.txt" in dockerfile and 'ENTRYPOINT ["/opt/apache/beam/boot"]' in dockerfile


@pytest.mark.parametrize("accelerator,runtime", [("tpu", "libtpu"), ("gpu", "jax-cuda12-plugin")])
def test_the_accelerator_locks_pin_jax_as_the_main_lock_does(accelerator, runtime):
    main, extra = _pins(REPO / "requirements" / "lock.txt"), _pins(REPO / "requirements" / f"lock-{accelerator}.txt")
    assert runtime in extra
    for name in ("jax", "jaxlib", "apache-beam", "numpy"):
        assert extra[name] == main[name], name


def test_make_worker_image_without_docker_says_so_and_fails(tmp_path):
    (tmp_path / "bash").symlink_to(shutil.which("bash"))  # make's shell, and nothing else on PATH
    done = subprocess.run([shutil.which("make"), "-s", "worker-image"], cwd=REPO, capture_output=True, text=True,
                          env={"PATH": str(tmp_path)}, timeout=60)
    assert done.returncode == 2
    assert "make worker-image: no Docker here" in done.stderr
