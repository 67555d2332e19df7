"""Check model-written Python against test cases, in the sandbox, many programs at a time.

Tests come in the shapes of the public datasets::

    CodeTests.from_record({"test": "def check(candidate): ...", "entry_point": "add", "prompt": "def add(a, b):\\n"})
    CodeTests.from_record({"test_list": ["assert add(1, 2) == 3"], "test_setup_code": ""})   # MBPP
    CodeTests.from_record(["assert add(1, 2) == 3"])                                         # plain asserts

Every test gets a verdict with its reason: ``passed``, ``failed`` (an assertion), ``error`` (another
exception), ``timeout``, ``memory``, ``file_size``, or, when the program died before reaching it,
``crashed`` / ``killed``.

Two sandboxes run side by side for each check: the program with ``code_driver.py``, which only
computes, and the tests with ``code_judge.py``, which decides; they share nothing but a pair of pipes
carrying plain data (``plain_data.py``). Verdicts come from the judge's own channel, which the program
cannot reach.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import os
import random
import re
import signal
import threading
from pathlib import Path
from typing import Any, Iterable

from rlax_core.config import require
from rlax_core.sandbox.run import (SANDBOX_UID_BASE, SANDBOX_UID_COUNT, PreparedSandbox, SandboxLimits,
                                      SandboxReport, StaleSandbox)

DRIVER = Path(__file__).with_name("code_driver.py")
JUDGE = Path(__file__).with_name("code_judge.py")
PLAIN_DATA = Path(__file__).with_name("plain_data.py")
MAX_REPLY_BYTES = 1 << 20  # one answer of the program, as plain data
# The judge outlives the program's wall-clock limit by this much, so it sees the program end and says so.
JUDGE_MARGIN_S = 5.0
# A prepared sandbox pair waits this long for a check, then ends (the pool starts another when needed).
IDLE_SECONDS = 300.0
VERDICT_LINE_BYTES = 4096  # the judge's longest verdict line (code_judge.py cuts each to fit)
VERDICTS = ("passed", "failed", "error", "timeout", "memory", "file_size", "crashed", "killed")


@dataclasses.dataclass(frozen=True)
class CodeTests:
    """The tests of one problem: ``cases`` run one by one after ``setup``, in the program's namespace."""

    cases: tuple[str, ...]
    setup: str = ""
    prompt: str = ""  # the code a completion continues (HumanEval's signature and docstring)
    entry_point: str = ""  # the function the prompt defines; when the completion lacks it, prompt + completion runs

    def __post_init__(self):
        require(len(self.cases) > 0, "cases", "at least one test case is needed")

    @classmethod
    def from_record(cls, value: Any) -> "CodeTests":
        """Tests from an Example's ``tests`` field (JSON text or decoded): HumanEval, MBPP or a list of asserts."""
        if isinstance(value, str):
            value = json.loads(value)
        if isinstance(value, (list, tuple)) and all(isinstance(case, str) for case in value):
            return cls(cases=tuple(value))
        if isinstance(value, dict) and "test" in value and "entry_point" in value:
            entry = value["entry_point"]
            return cls(cases=(f"{value['test']}\n\ncheck({entry})\n",), prompt=value.get("prompt", ""), entry_point=entry)
        if isinstance(value, dict) and "test_list" in value:
            setup = "\n".join(filter(None, [value.get("test_setup_code", ""), *value.get("test_imports", [])]))
            return cls(cases=tuple(value["test_list"]), setup=setup)
        if isinstance(value, dict) and "cases" in value:
            return cls(cases=tuple(value["cases"]), setup=value.get("setup", ""), prompt=value.get("prompt", ""),
                       entry_point=value.get("entry_point", ""))
        raise ValueError("code tests must be a list of asserts, a HumanEval record (test, entry_point), an MBPP "
                         f"record (test_list) or {{cases, setup}}; got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class TestVerdict:
    index: int
    reason: str  # one of VERDICTS
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.reason == "passed"


@dataclasses.dataclass(frozen=True)
class CodeResult:
    verdicts: tuple[TestVerdict, ...]
    wall_seconds: float
    isolated: bool

    @property
    def all_passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    @property
    def pass_fraction(self) -> float:
        return sum(v.passed for v in self.verdicts) / len(self.verdicts)

    def info(self) -> dict[str, Any]:
        """A JSON-friendly summary for a rollout's ``reward_info``."""
        return {
            "passed": sum(v.passed for v in self.verdicts),
            "total": len(self.verdicts),
            "verdicts": [{"reason": v.reason, "detail": v.detail} for v in self.verdicts],
            "wall_seconds": round(self.wall_seconds, 4),
            "isolated": self.isolated,
        }


# Linear on any text (this runs on model output in the scorer's process, outside the sandbox): no two
# unbounded runs of one character class follow each other, so a run of blanks is read once.
_FENCE = re.compile(r"```[ \t]*(?:(?:python3|python|py)[ \t]*)?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last fenced code block of a completion, or the whole completion when it has none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def build_program(completion: str, tests: CodeTests) -> str:
    """The program to test: the extracted code, after the prompt when the code does not define the entry point.

    A completion that writes the whole function still gets the prompt's imports (``from typing import
    List``), which chat models routinely leave out.
    """
    code = extract_code(completion)
    # Blanks only within a line: ``^\s*`` would cross newlines, and 64,000 of them took seconds to scan.
    defines = rf"^[ \t]*def[ \t]+{re.escape(tests.entry_point)}[ \t]*\("
    if tests.entry_point and not re.search(defines, code, re.MULTILINE):
        return tests.prompt + code
    imports = [line for line in tests.prompt.splitlines() if re.match(r"(?:import|from)\s+\w", line)]
    return "\n".join(imports + [code]) if imports else code


@functools.cache
def _scripts() -> tuple[str, str, str]:
    """The three files shipped into the sandboxes, read once: every check of a process runs the same code."""
    return DRIVER.read_text(), JUDGE.read_text(), PLAIN_DATA.read_text()


class PreparedCheck:
    """A program sandbox and a judge sandbox, started and wired to each other, waiting for one check.

    Both interpreters are up (``PreparedSandbox``) before the check is known: a pool of these
    (``CodeVerifier``) starts the next pair while the current check runs. The jobs arrive on stdin.
    """

    def __init__(self, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits
        to_program, from_program, lifeline = os.pipe(), os.pipe(), os.pipe()
        program_uid, judge_uid = (SANDBOX_UID_BASE + n for n in random.sample(range(SANDBOX_UID_COUNT), 2))
        driver, judge_script, plain_data = _scripts()
        self.program = PreparedSandbox({"driver.py": driver, "plain_data.py": plain_data}, ["driver.py"], limits,
                                       channels={4: to_program[0], 5: from_program[1]}, uid=program_uid,
                                       lifeline=lifeline[0], idle_seconds=IDLE_SECONDS)
        self.judge = PreparedSandbox(
            {"judge.py": judge_script, "plain_data.py": plain_data}, ["judge.py"],
            dataclasses.replace(limits, wall_seconds=limits.wall_seconds + JUDGE_MARGIN_S),
            channels={4: to_program[1], 5: from_program[0], 6: lifeline[1]}, uid=judge_uid, idle_seconds=IDLE_SECONDS)

    @property
    def waiting(self) -> bool:
        return self.program.waiting and self.judge.waiting

    def run(self, program: str, tests: CodeTests, per_test_seconds: float) -> CodeResult:
        limits = self.limits
        program_job = {"program": program, "setup": tests.setup, "per_call_seconds": per_test_seconds,
                       "max_reply_bytes": MAX_REPLY_BYTES}
        judge_job = {"tests": list(tests.cases), "setup": tests.setup,
                     "prompt": tests.prompt if tests.entry_point else "", "entry_point": tests.entry_point,
                     "per_test_seconds": per_test_seconds, "ready_seconds": limits.wall_seconds + JUDGE_MARGIN_S / 2,
                     "max_reply_bytes": MAX_REPLY_BYTES, "verdict_line_bytes": VERDICT_LINE_BYTES}
        try:
            self.judge.start(json.dumps(judge_job).encode(), verdict_channel_bytes(len(tests.cases), limits))
            self.program.start(json.dumps(program_job).encode())
        except StaleSandbox:
            self.cancel()
            raise
        try:
            judge = self.judge.report()
        finally:
            report = self.program.report()  # the judge is gone: its lifeline ends a program still running
        return CodeResult(_verdicts(judge, report, len(tests.cases), limits), judge.wall_seconds,
                          judge.isolated and report.isolated)

    def cancel(self) -> None:
        self.judge.cancel()
        self.program.cancel()


def run_tests(program: str, tests: CodeTests, limits: SandboxLimits = SandboxLimits(),
              per_test_seconds: float = 5.0) -> CodeResult:
    """Run ``program`` in one sandbox and its tests in another (the judge); a verdict for every test."""
    return PreparedCheck(limits).run(program, tests, per_test_seconds)


class VerdictChannelOverflow(RuntimeError):
    """The judge wrote more verdicts than its channel holds: a harness fault, never the program's verdict."""


def verdict_channel_bytes(count: int, limits: SandboxLimits) -> int:
    """The judge's verdict channel: room for every test's longest verdict line (the judge cuts each to fit)."""
    return max(limits.output_bytes, (count + 1) * VERDICT_LINE_BYTES)


def _verdicts(judge: SandboxReport, program: SandboxReport, count: int,
              limits: SandboxLimits) -> tuple[TestVerdict, ...]:
    if "results" in judge.overflowed:
        raise VerdictChannelOverflow(f"the judge's verdicts for {count} tests overflowed their channel "
                                     f"({verdict_channel_bytes(count, limits)} bytes); no verdict was taken")
    found: dict[int, TestVerdict] = {}
    for line in judge.results.splitlines():
        try:
            record = json.loads(line)
            index, reason, detail = int(record["index"]), str(record["reason"]), str(record.get("detail", ""))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut at output_bytes
        if reason == "ended":  # the program's process is gone: its own report says how
            reason, detail = _death(program, limits)
        if 0 <= index < count and reason in VERDICTS and index not in found:
            found[index] = TestVerdict(index, reason, detail[:400])
    missing = _death(judge, limits)  # the judge itself stopped: its limits, or a test that broke it
    return tuple(found.get(i) or TestVerdict(i, *missing) for i in range(count))


def _death(report: SandboxReport, limits: SandboxLimits) -> tuple[str, str]:
    """Why the program stopped before reporting a test."""
    if report.timed_out:
        return "timeout", f"wall-clock limit of {limits.wall_seconds:g} s"
    if report.signal in (signal.SIGXCPU, signal.SIGKILL) and report.cpu_seconds >= limits.cpu_seconds:
        return "timeout", f"CPU-time limit of {limits.cpu_seconds} s"
    if report.signal == signal.SIGXFSZ:
        return "file_size", "file-size limit"
    if report.signal is not None:
        return "killed", f"killed by signal {signal.Signals(report.signal).name}"
    tail = report.stderr.strip().splitlines()[-1:] or [""]
    if "MemoryError" in tail[0]:
        return "memory", tail[0][-400:]
    return "crashed", f"exit code {report.exit_code}: {tail[0][-400:]}"


class CodeVerifier:
    """A pool running many sandboxed checks in parallel (each check is its own process tree)."""

    def __init__(self, workers: int = 2, limits: SandboxLimits = SandboxLimits(), per_test_seconds: float = 5.0,
                 prepared: int | None = None):
        require(workers >= 1, "workers", "must be >= 1")
        self.limits, self.per_test_seconds = limits, per_test_seconds
        # Threads suffice: each one waits on a child process, which does the work and holds no GIL.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-verifier")
        # Sandbox pairs started ahead of the checks (one per worker by default): a check takes a waiting
        # pair and starts the next at once, so interpreter start-up overlaps the checks.
        self._prepared_count = workers if prepared is None else prepared
        self._prepared: collections.deque[PreparedCheck] = collections.deque()
        self._prepared_lock = threading.Lock()
        self._closed = False

    def _take_prepared(self) -> PreparedCheck:
        with self._prepared_lock:
            taken = None
            while self._prepared and taken is None:
                candidate = self._prepared.popleft()
                if candidate.waiting:
                    taken = candidate
                else:
                    candidate.cancel()  # its idle time ran out
            while not self._closed and len(self._prepared) < self._prepared_count:
                self._prepared.append(PreparedCheck(self.limits))
        return taken or PreparedCheck(self.limits)

    def check(self, completion: str, tests: CodeTests) -> CodeResult:
        program = build_program(completion, tests)
        try:
            return self._take_prepared().run(program, tests, self.per_test_seconds)
        except StaleSandbox:  # it ended between the look and the start: once more, on a fresh pair
            return PreparedCheck(self.limits).run(program, tests, self.per_test_seconds)

    def submit(self, completion: str, tests: CodeTests) -> concurrent.futures.Future:
        """One check on the pool; its future holds the result or what stopped the check."""
        return self._pool.submit(self.check, completion, tests)

    def check_many(self, items: Iterable[tuple[str, CodeTests]]) -> list[CodeResult]:
        """Results in input order."""
        return [future.result() for future in [self.submit(*item) for item in items]]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._prepared_lock:
            self._closed = True
            while self._prepared:
                self._prepared.popleft().cancel()

    def __enter__(self) -> "CodeVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def humaneval_tests(row: dict[str, Any]) -> CodeTests:
    return CodeTests.from_record({k: row[k] for k in ("test", "entry_point", "prompt")})


def mbpp_tests(row: dict[str, Any]) -> CodeTests:
    return CodeTests.from_record({k: row[k] for k in ("test_list", "test_setup_code", "test_imports") if k in row})
