"""``rlax compile`` run as a user runs it, for the compile lanes (tests/compile/): the table goes to the
lane's log, the JSON report comes back with the run's stdout and stderr beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_compile(out_dir: Path, recipe: str, arguments: list[str], timeout: int = 900) -> dict:
    """``rlax compile --config recipe --json out_dir/compile.json *arguments``; fails on a non-zero exit."""
    out = out_dir / "compile.json"
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "compile", "--config", recipe, "--json", str(out),
                           *arguments], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    print(done.stdout)  # the table, in the lane's log
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    report["stdout"], report["stderr"] = done.stdout, done.stderr
    return report
