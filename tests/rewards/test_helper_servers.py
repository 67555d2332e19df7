"""The long-lived helper servers of one process (the sandbox zygote, the math workers' parent) live
as long as that process, whatever it set process-wide before starting them.

Found in CI: Beam's GCS credentials lookup sets ``socket.setdefaulttimeout(60)`` for the whole
process. Sockets made after that are O_NONBLOCK, and a server handed one ended at its first read with
nothing queued: every later job restarted it, and a job queued as it died ended without a report.
"""

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import os, socket, sys, time
    from pathlib import Path

    socket.setdefaulttimeout(60)  # as apache_beam.internal.gcp.auth does on the first gs:// access

    def children(marker):
        found = []
        for entry in Path("/proc").iterdir():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and marker in command:
                found.append(int(entry.name))
        return found

    which = sys.argv[1]
    if which == "sandbox":
        from rlax_core.sandbox.run import run_sandboxed
        job = lambda: run_sandboxed({"main.py": "print(6 * 7)"}, ["main.py"]).stdout == "42\\n"
        marker = b"sandbox/launcher.py"
    else:
        from rlax_core.rewards.math_verifier import MathVerifier, MathVerifierConfig
        verifier = MathVerifier(MathVerifierConfig(workers=1))
        job = lambda: verifier.compare("x^2 + 2x + 1", "(x+1)^2").equal
        marker = b"rlax_core.rewards.math_worker"
    seen = []
    for _ in range(3):
        assert job()
        seen.append(children(marker))
        time.sleep(0.5)  # the server idles with nothing queued
    print(seen)
    assert len(seen[0]) == 1 and seen[0] == seen[1] == seen[2], seen
""")


def _run(which: str) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT, which], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_the_sandbox_zygote_survives_a_process_wide_default_socket_timeout():
    _run("sandbox")


def test_the_math_worker_parent_survives_a_process_wide_default_socket_timeout():
    _run("math")
