"""Inside the sandbox: run a candidate program, then each of its tests, and report every verdict.

A standalone script (standard library only) that ``code_verifier.py`` ships into the sandbox beside
``job.json``. The candidate runs once; each test then runs in the candidate's namespace under its own
alarm. One JSON line per test goes to fd 3 as soon as it is known, so a program that later dies or
hangs still leaves the verdicts it earned. The sandbox's limits stand behind the alarm: a test that
swallows the alarm's exception still meets the CPU and wall-clock limits.
"""

import errno
import json
import os
import signal
import sys
import traceback

CHANNEL_FD = 3
DETAIL_CHARS = 400


class TestTimeout(BaseException):
    """Raised by the alarm; a BaseException so that ``except Exception`` in the candidate cannot eat it."""


def _on_alarm(signum, frame):
    raise TestTimeout()


def _reason(error: BaseException) -> str:
    if isinstance(error, TestTimeout):
        return "timeout"
    if isinstance(error, MemoryError):
        return "memory"
    if isinstance(error, AssertionError):
        return "failed"
    if isinstance(error, OSError) and error.errno == errno.EFBIG:
        return "file_size"
    return "error"


def _detail(error: BaseException) -> str:
    if isinstance(error, TestTimeout):
        return "test exceeded its time limit"
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip()[-DETAIL_CHARS:]


def _run(source: str, filename: str, namespace: dict, seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        exec(compile(source, filename, "exec"), namespace)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    channel = os.fdopen(CHANNEL_FD, "w", buffering=1)
    with open("job.json", encoding="utf-8") as handle:
        job = json.load(handle)
    os.remove("job.json")  # the candidate has no business reading its tests
    # Verdict lines carry a secret the candidate is never handed: a line it writes to fd 3 itself
    # does not count. (A candidate that digs the secret out of this interpreter's memory can still
    # forge one: verdicts come from the process that runs it, as in every HumanEval-style harness.)
    token = job.pop("token")
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(10_000)

    driver_pid = os.getpid()

    def report(index: int, reason: str, detail: str = "") -> None:
        if os.getpid() != driver_pid:  # a child the candidate forked does not get a say
            return
        channel.write(token + " " + json.dumps({"index": index, "reason": reason, "detail": detail}) + "\n")

    # Not "__main__": a candidate's ``if __name__ == "__main__":`` block (reading input, ...) stays off.
    namespace = {"__name__": "candidate"}
    seconds = job["per_test_seconds"]
    try:
        _run(job["program"], "candidate.py", namespace, seconds)
        _run(job["setup"], "test_setup.py", namespace, seconds)
    except BaseException as error:  # noqa: BLE001 - every failure of the candidate is a verdict
        for index in range(len(job["tests"])):
            report(index, _reason(error), "program: " + _detail(error))
        return
    for index, test in enumerate(job["tests"]):
        try:
            _run(test, f"test_{index}.py", namespace, seconds)
        except BaseException as error:  # noqa: BLE001
            report(index, _reason(error), _detail(error))
        else:
            report(index, "passed")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: the candidate may have left threads or atexit hooks behind
