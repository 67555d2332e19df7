"""Sandboxes started ahead of their checks: the wall clock starts with the job, stale ones are replaced.

``CodeVerifier`` keeps a pair of prepared sandboxes per worker (``PreparedCheck``) so the next check
finds its interpreters up; containment is the same sandbox (every other test under tests/rewards runs
through this pool).
"""

import time

import pytest

from rlax_core.rewards import CodeTests, CodeVerifier
from rlax_core.sandbox.run import SandboxLimits
from rlax_core.sandbox.run import PreparedSandbox, StaleSandbox

LIMITS = SandboxLimits(cpu_seconds=3, wall_seconds=3.0, memory_bytes=256 << 20, file_bytes=4 << 20,
                       workdir_bytes=8 << 20)
READS_STDIN = "import sys\ndata = sys.stdin.read()\nprint(len(data), data[:5])\n"


def test_the_wall_clock_starts_with_the_job_not_with_the_sandbox():
    sandbox = PreparedSandbox({"main.py": READS_STDIN + "import time\ntime.sleep(1.5)\n"}, ["main.py"], LIMITS)
    time.sleep(2.5)  # waiting longer than the wall limit leaves the whole limit to the job
    assert sandbox.waiting
    sandbox.start(b"hello world")
    report = sandbox.report()
    assert not report.timed_out and report.exit_code == 0 and report.stdout == "11 hello\n", report
    assert report.wall_seconds < LIMITS.wall_seconds


def test_a_sandbox_idle_past_its_limit_ends_and_says_so():
    sandbox = PreparedSandbox({"main.py": READS_STDIN}, ["main.py"], LIMITS, idle_seconds=0.5)
    deadline = time.monotonic() + 30
    while sandbox.waiting and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sandbox.waiting
    with pytest.raises(StaleSandbox):
        sandbox.start(b"late")


def test_a_cancelled_sandbox_runs_no_job():
    sandbox = PreparedSandbox({"main.py": READS_STDIN}, ["main.py"], LIMITS)
    sandbox.cancel()
    report = sandbox.report()
    assert report.stopped and not report.timed_out and "hello" not in report.stdout


def test_the_program_reads_nothing_of_the_judge_and_only_its_own_job_on_stdin():
    program = "import sys\nSEEN = sys.stdin.read()\ndef f():\n    return SEEN\n"
    tests = CodeTests(cases=("assert 'assert' not in f() and len(f()) == 0",))
    with CodeVerifier(workers=1, limits=LIMITS, per_test_seconds=2.0) as verifier:
        assert verifier.check(program, tests).all_passed  # the driver read the job first: stdin is at its end


def test_the_pool_replaces_stale_pairs():
    square = CodeTests(cases=("assert f(3) == 9",))
    with CodeVerifier(workers=1, limits=LIMITS, per_test_seconds=2.0) as verifier:
        assert verifier.check("def f(x):\n    return x * x\n", square).all_passed
        for prepared in verifier._prepared:
            prepared.cancel()  # as if their idle time had run out
        assert verifier.check("def f(x):\n    return x * x\n", square).all_passed
        assert not verifier.check("def f(x):\n    return x\n", square).all_passed


def test_a_sandbox_that_cannot_be_built_says_so_when_its_job_comes():
    from rlax_core.sandbox.run import SandboxUnavailable

    impossible = SandboxLimits(**{**LIMITS.__dict__, "open_files": 1 << 40})
    sandbox = PreparedSandbox({"main.py": READS_STDIN}, ["main.py"], impossible)
    deadline = time.monotonic() + 30
    while sandbox.waiting and time.monotonic() < deadline:
        time.sleep(0.1)  # its handler has reported and gone: the start pipe is closed
    with pytest.raises(SandboxUnavailable, match="sandbox setup failed"):
        sandbox.start(b"job")
