"""pytest plugin: a real GCS API on localhost (fake-gcs-server), with the Google clients pointed at it.

The session fixture ``gcs_emulator`` starts the emulator (built once from Go modules by
``scripts/build_fake_gcs.sh``), sets ``STORAGE_EMULATOR_HOST`` (read by google-cloud-storage and gcsfs)
and anonymous credentials for gcsfs, for this process and the subprocesses it starts, and gives
``make_bucket()`` -> a fresh ``gs://`` URL. Register it with ``pytest_plugins`` in tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_fake_gcs.sh"
START_TIMEOUT_S = 30.0

# gcsfs >= 2025 first asks the gRPC storage-control API for a bucket's layout; the emulator speaks only
# the JSON API, so every first access would wait out a 60 s timeout. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


class GcsEmulator:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="rlax-test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def make_bucket(self, prefix: str = "rlax-test") -> str:
        """Create an empty bucket; returns its ``gs://`` URL."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(name)
        return f"gs://{name}"


def _emulator_binary() -> str:
    explicit = os.environ.get("RLAX_FAKE_GCS_SERVER")
    if explicit:
        return explicit
    try:
        built = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True, timeout=1500)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        stderr = getattr(error, "stderr", "") or ""
        pytest.fail(f"cannot build the GCS emulator with {BUILD_SCRIPT}: {error}\n{stderr[-2000:]}")
    return built.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_serving(endpoint: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"fake-gcs-server exited with code {process.returncode}: {process.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    process.kill()
    pytest.fail(f"fake-gcs-server did not answer at {endpoint} within {START_TIMEOUT_S:.0f}s")


@pytest.fixture(scope="session")
def gcs_emulator():
    binary = _emulator_binary()
    if not shutil.which(binary) and not os.access(binary, os.X_OK):
        pytest.fail(f"GCS emulator binary {binary!r} is not executable")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
         "-public-host", f"127.0.0.1:{port}", "-external-url", endpoint, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    _wait_until_serving(endpoint, process)
    saved = {key: os.environ.get(key) for key in ("STORAGE_EMULATOR_HOST", "FSSPEC_GS_TOKEN")}
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    os.environ["FSSPEC_GS_TOKEN"] = "anon"  # gcsfs in subprocesses: no credential lookup
    import fsspec.config

    saved_fsspec = fsspec.config.conf.get("gs")
    fsspec.config.conf["gs"] = {**(saved_fsspec or {}), "token": "anon"}
    try:
        yield GcsEmulator(endpoint)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if saved_fsspec is None:
            fsspec.config.conf.pop("gs", None)
        else:
            fsspec.config.conf["gs"] = saved_fsspec
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
