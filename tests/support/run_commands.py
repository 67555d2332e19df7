"""Run ``rlax`` commands one after another in this interpreter; print each one's exit code and output.

    python tests/support/run_commands.py < commands.json      # a JSON list of command lines

Each result is one JSON line ``{"command", "code", "stdout", "stderr"}``. The documented-commands test
runs every Dataflow command of the recipes and docs this way inside a network namespace with no
network (``unshare -n``): one interpreter for all of them, so Beam and JAX are imported once.
"""

import contextlib
import io
import json
import shlex
import sys

from pipelines.cli import main


def run(command: str) -> dict:
    words = shlex.split(command.partition("  #")[0])
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(words[1:])
        except SystemExit as exit_:
            code = exit_.code
        except Exception as error:  # noqa: BLE001 - a traceback is a result: the test shows it
            import traceback

            traceback.print_exc()
            code = f"raised {type(error).__name__}"
    return {"command": command, "code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


if __name__ == "__main__":
    for line in json.load(sys.stdin):
        print(json.dumps(run(line)), flush=True)
