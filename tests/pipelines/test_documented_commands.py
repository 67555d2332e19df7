"""Every command written in a recipe's header, in docs/dataflow.md and in the README, run as written.

The commands are read from the files, so a command added there is tested without touching this
file. A Dataflow command (a Beam command whose recipe, or whose ``--runner``, is the DataflowRunner)
runs with ``--dry_run=True`` added, inside a network namespace with no network (``unshare -n``): it
must translate its job without a network or credentials, and say which inputs it did not check.
``rlax plan`` runs there as written too. ``rlax train`` with a Dataflow recipe runs on the trainer
slice's hosts; here its recipe's trainer must plan and fit. Commands of other tools (docker,
gcloud, tensorboard) need Docker or a Google Cloud project and are listed, not run. Local commands
run for real: the small recipes' headers here (slow lane), the README's in ``test_readme.py``, the
rehearsals and the quickstart by the tests ``LOCAL_ELSEWHERE`` names; ``NEEDS_DATA`` lists the two
recipes whose commands need data this repository does not hold.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import BEAM_COMMANDS
from rlax_core.config import read_yaml
from tests.support.doc_commands import fenced_blocks, joined_lines

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "docs/dataflow.md", *sorted(f"configs/{p.name}" for p in (REPO / "configs").glob("*.yaml"))]
TOOLS = ("rlax", "make", "docker", "gcloud", "tensorboard", ".venv/bin/python")
ELSEWHERE = {  # a tool whose commands need what this machine has not: why they are listed, not run
    "docker": "needs a Docker daemon and a registry (make worker-image says so where there is none)",
    "gcloud": "needs a Google Cloud project and its credentials",
    "tensorboard": "serves a web page over the run's metrics until stopped",
}


def _joined(lines: list[str]) -> list[str]:
    return [line for line in joined_lines("\n".join(lines)) if line.startswith(TOOLS)]


def recipe_header_commands(path: Path) -> list[str]:
    """Commands in the comment block at the top of a YAML recipe: indented lines (``#   rlax ...``;
    ``\\`` continues), not the prose beside them (``# rlax filter on Dataflow: ...``)."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:] if line.startswith("#  ") else "")
    return _joined(header)


def markdown_commands(path: Path) -> list[str]:
    """Commands in the fenced blocks of a Markdown file (comment lines dropped, continuations joined)."""
    return [command for body in fenced_blocks(path.read_text()) for command in _joined(body.splitlines())]


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for every command of :data:`DOCUMENTS`, in order."""
    found = []
    for document in DOCUMENTS:
        path = REPO / document
        commands = recipe_header_commands(path) if path.suffix == ".yaml" else markdown_commands(path)
        found += [(document, command) for command in commands]
    return found


def _words(command: str) -> list[str]:
    return shlex.split(command.partition("  #")[0])


def _recipe(words: list[str]) -> dict:
    if "--config" not in words:
        return {}
    return read_yaml(REPO / words[words.index("--config") + 1])


def kind(command: str) -> str:
    """``dataflow`` (dry run offline), ``plan`` (offline, as written), ``trainer_slice``, ``elsewhere`` or ``local``."""
    words = _words(command)
    if words[0] in ELSEWHERE:
        return "elsewhere"
    if words[0] != "rlax":
        return "local"
    runner = (_recipe(words).get("beam") or {}).get("runner", "")
    on_dataflow = runner == "DataflowRunner" or "DataflowRunner" in words or "--runner=DataflowRunner" in words
    if words[1] in BEAM_COMMANDS and on_dataflow:
        return "dataflow"
    if words[1] == "plan":
        return "plan"
    if words[1] == "train" and on_dataflow:
        return "trainer_slice"
    return "local"


COMMANDS = documented_commands()


def test_the_commands_are_read_from_the_documents():
    by_document = {document: [c for d, c in COMMANDS if d == document] for document in DOCUMENTS}
    assert "rlax filter --config configs/filter_dataflow_gpu.yaml --region us-west4 --machine_type ct5lp-hightpu-4t " \
           "--dataflow_service_options \"worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2\" " \
           "--sdk_container_image us-docker.pkg.dev/my-gcp-project/rlax/rlax-worker-tpu:latest" \
           in by_document["configs/filter_dataflow_gpu.yaml"]
    for recipe in ("qwen25_7b_math_dataflow_tpu", "qwq32b_code_tpu_1024", "qwen25_1p5b_math_dataflow_gpu"):
        kinds = [kind(c) for c in by_document[f"configs/{recipe}.yaml"]]
        assert kinds.count("dataflow") == 4 and "trainer_slice" in kinds and "local" in kinds, recipe
    assert any(kind(c) == "dataflow" for c in by_document["docs/dataflow.md"])
    assert any(kind(c) == "dataflow" for c in by_document["README.md"])


def _network_namespace() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    done = subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=30)
    return [unshare, "-n"] if done.returncode == 0 else None


def _dry_run(command: str) -> str:
    return command if "--dry_run" in command else f"{command.partition('  #')[0].rstrip()} --dry_run=True"


@pytest.mark.slow  # one interpreter translates ~25 jobs: a minute or two on 2 cores
def test_every_documented_dataflow_command_translates_without_a_network():
    namespace = _network_namespace()
    if namespace is None:
        pytest.skip("unshare -n is not permitted here (no user namespaces): no network namespace to run in")
    dataflow = [c for _, c in COMMANDS if kind(c) == "dataflow"]
    plans = [c for _, c in COMMANDS if kind(c) == "plan"]
    trainers = sorted({f"rlax plan --config {_words(c)[_words(c).index('--config') + 1]}"
                       for _, c in COMMANDS if kind(c) == "trainer_slice"})
    batch = [_dry_run(c) for c in dataflow] + plans + trainers
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    env.update(PYTHONPATH=str(REPO), HOME=os.environ.get("HOME", "/root"))
    done = subprocess.run([*namespace, sys.executable, str(REPO / "tests" / "support" / "run_commands.py")],
                          input=json.dumps(batch), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    results = {r["command"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert len(results) == len(set(batch)), done.stderr[-3000:]
    for command in batch:
        result = results[command]
        said = f"{command}\n{result['stdout'][-2000:]}\n{result['stderr'][-3000:]}"
        assert result["code"] == 0, said
        if command in plans or command in trainers:
            assert "does not fit" not in result["stdout"] + result["stderr"], said
            continue
        job = json.loads([line for line in result["stdout"].splitlines() if line.startswith('{"')][-1])
        assert job["runner"] == "DataflowRunner" and job["inputs_not_checked"], said
        if job["dry_run"] != "curate":  # the model's jobs: an accelerator, one SDK process that owns it, an image
            assert job["accelerator"] and "no_use_multiple_sdk_containers" in job["experiments"], said
            assert "use_multiple_sdk_containers" not in job["experiments"], said
    for command in trainers:
        assert "trainer:" in results[command]["stdout"], command


def test_commands_of_other_tools_are_named_with_why_they_are_not_run_here():
    others = [c for _, c in COMMANDS if kind(c) == "elsewhere"]
    assert all(_words(c)[0] in ELSEWHERE for c in others)


# Local commands of the recipes' headers and docs/dataflow.md: run here as written (below), or by the
# test named (the same command with fewer rows or steps), or not runnable from this repository alone.
LOCAL_ELSEWHERE = {
    "rlax quickstart": "tests/foundation/test_readme.py runs the README's quickstarts, dense, MoE and warm-started "
                       "(shortened); tests/pipelines/test_quickstart_moe.py the MoE one in full, "
                       "tests/pipelines/test_quickstart_warm.py the warm-started one",
    "rlax launch": "tests/pipelines/test_rehearsal.py rehearses the math and code recipes (--rows 4, on gs://)",
}
NEEDS_DATA = {
    "configs/curate_gsm8k_math.yaml": "the full GSM8K and MATH in ../shared/data (the tests use nothing there)",
    "configs/evaluate_math.yaml": "two trained checkpoints (base/, runs/step_200/) and ../shared/data's eval sets",
}
# Recipes whose header commands one test runs as written, in order, end to end.
RUN_BY_THEIR_TEST = {"configs/quickstart_sql.yaml": "tests/pipelines/test_quickstart_sql.py (slow lane)",
                     "configs/quickstart_rm.yaml": "tests/pipelines/test_quickstart_rm.py (slow lane)"}
WORKER_IMAGE = "make worker-image"  # without Docker it says so and exits 2 (tests/foundation/test_worker_image.py)


def _local_runs() -> dict[str, list[str]]:
    """Per document, its local commands this file runs as written, in order."""
    runs: dict[str, list[str]] = {}
    for document, command in COMMANDS:
        if kind(command) != "local" or document in NEEDS_DATA or document == "README.md":  # the README's: test_readme
            continue
        if document in RUN_BY_THEIR_TEST:
            continue
        if command.startswith(tuple(LOCAL_ELSEWHERE)):
            continue
        runs.setdefault(document, []).append(command)
    return runs


def test_every_local_command_is_run_here_or_by_a_named_test():
    runs = _local_runs()
    assert set(runs) == {"configs/filter_stories260k.yaml", "configs/evaluate_stories260k.yaml",
                         "configs/rft_stories260k.yaml", "docs/dataflow.md"}
    assert all(c.startswith(WORKER_IMAGE) for c in runs["docs/dataflow.md"])


@pytest.mark.slow  # three small Beam jobs on stories260K
@pytest.mark.parametrize("document", ["configs/filter_stories260k.yaml", "configs/evaluate_stories260k.yaml",
                                      "configs/rft_stories260k.yaml"])
def test_the_small_recipes_header_commands_run_as_written(document, tmp_path):
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    # evaluate_stories260k compares the base with the quickstart's exported model; a Hugging Face folder
    # of the same model (the bundled stories260K, as the quickstart exports it) stands at that path.
    shutil.copytree(REPO / "pipelines" / "assets" / "stories260K", tmp_path / "runs" / "quickstart" / "final_model")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{env['PATH']}", PYTHONPATH=str(REPO),
               XLA_FLAGS=env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "").strip())
    script = "\n".join(["set -euo pipefail", *(c.partition("  #")[0] for c in _local_runs()[document])])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"{script}\n---\n{(done.stdout + done.stderr)[-4000:]}"
    assert any(said in done.stdout for said in ("rlax filter: kept", "rlax evaluate:", "rlax rft:"))
