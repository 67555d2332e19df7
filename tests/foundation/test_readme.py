"""Every command block of the README runs, as written, in a fresh clone of the repository.

The clone has nothing beside it (no ``../shared``) and builds its own ``.venv`` through ``make
quickstart``, as a new user's does. Blocks run in order, each as one bash script (``set -e``), so a
block may use what an earlier one made (``runs/quickstart/filtered``). Short settings keep the test
within minutes; each is listed in ``SHORT`` and only adds options, so the command is still the one a
reader types. Test lanes named in the README are collected, not run (``make test`` and ``make
test-slow`` run them). A block whose first line is ``# needs a Google Cloud project`` is checked only
for its recipes: each ``--config`` it names exists and loads. Blocks run as in the reader's shell
after the first block's ``source .venv/bin/activate`` (the clone's ``.venv/bin`` leads PATH). A
command that names an output folder must say where its output went: the folder appears in what it
prints.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFTEST_XLA_FLAGS = "--xla_force_host_platform_device_count=8"  # what tests/conftest.py sets when unset
CLOUD = "# needs a Google Cloud project"

# README command (start of line) -> options appended to it in this test.
SHORT = {
    "make quickstart": ' ARGS="--filter-prompts 16 trainer.total_steps=2"',
    "make test": ' PYTEST_ARGS="tests/foundation/test_config.py"',
    # Before "rlax quickstart" (the first match counts): the stages before RL sample fewer prompts too.
    "rlax quickstart --config configs/quickstart_warm.yaml": " --filter-prompts 16 --no-cold trainer.total_steps=2 rft.limit=32",
    "rlax quickstart --config configs/quickstart_rm.yaml": " --filter-prompts 16 trainer.total_steps=2 rft.limit=48",
    "rlax quickstart": " --filter-prompts 16 trainer.total_steps=2",
    "rlax launch": " trainer.total_steps=2",
}
COLLECT_ONLY = " --collect-only -q"  # for `python -m pytest ...` lines
COMMAND_START = re.compile(r"^(rlax|make|source|\.venv/bin/|python)\b")


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def commands(body: str) -> list[str]:
    """The block's commands, continuation lines joined, comment lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", body)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def shorten(command: str) -> str:
    code, _, comment = command.partition("  #")
    code = code.rstrip()
    if " -m pytest " in code:
        return code + COLLECT_ONLY
    for start, extra in SHORT.items():
        if code.startswith(start):
            return code + extra
    return code


def outputs_named(command: str) -> list[str]:
    words = shlex.split(command.partition("  #")[0])
    named = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--output"]
    return named + [word.split("=", 1)[1] for word in words if word.startswith("OUTPUT=")]


def test_readme_parsing():
    text = "```bash\nrlax a \\\n    --output runs/x  # note\n# comment\nmake test\n```\n```\nnot a command\n```\n"
    ((language, body), (plain, _)) = readme_blocks(text)
    assert (language, plain) == ("bash", "")
    assert commands(body) == ["rlax a --output runs/x  # note", "make test"]
    assert [shorten(c) for c in commands(body)] == ["rlax a --output runs/x", "make test" + SHORT["make test"]]
    assert outputs_named(commands(body)[0]) == ["runs/x"]


def test_commands_stand_only_in_bash_blocks():
    # An unlabeled block holding a command would escape the test below.
    stray = [line for language, body in readme_blocks((REPO / "README.md").read_text())
             if language != "bash" and language != "python" for line in body.splitlines()
             if COMMAND_START.match(line)]
    assert stray == []


@pytest.mark.slow  # a fresh clone builds its .venv (uv's cache) and runs the quickstart twice, short
def test_every_readme_command_runs_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "rlax"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=300)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "RLAX_SHARED_DIR") and not key.startswith("PYTEST")}
    # The tests' simulated mesh is no reader's: the quickstart runs on the machine's cores.
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(CONFTEST_XLA_FLAGS, "").strip()
    # The reader's shell after the README's first block (`source .venv/bin/activate`): rlax on PATH.
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    blocks = readme_blocks((clone / "README.md").read_text())
    ran = 0
    for language, body in blocks:
        if language != "bash":
            continue
        if body.startswith(CLOUD):
            for command in commands(body):
                config = shlex.split(command.partition("  #")[0])
                recipe = config[config.index("--config") + 1]
                check = subprocess.run([sys.executable, "-c", "import sys; from pipelines.config import "
                                        "load_run_config; load_run_config(sys.argv[1])", recipe],
                                       cwd=clone, env={**env, "PYTHONPATH": str(clone)}, capture_output=True,
                                       text=True, timeout=300)
                assert check.returncode == 0, f"{recipe}: {check.stderr[-2000:]}"
            continue
        script = "\n".join(["set -euo pipefail", *(shorten(c) for c in commands(body))])
        done = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=1800)
        said = done.stdout + done.stderr
        assert done.returncode == 0, f"README block failed (exit {done.returncode}):\n{script}\n---\n{said[-5000:]}"
        for command in commands(body):
            for folder in outputs_named(command):
                assert folder in said, f"{command!r} did not say where its output went ({folder})"
        ran += 1
    assert ran >= 5, f"only {ran} README blocks ran"
    assert (clone / "runs/quickstart/report.json").is_file() and (clone / "runs/quickstart/final_model").is_dir()
    assert not (tmp_path / "shared").exists()
