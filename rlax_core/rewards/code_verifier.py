"""Check model-written Python against test cases, in the sandbox, many programs at a time.

Tests come in the shapes of the public datasets::

    CodeTests.from_record({"test": "def check(candidate): ...", "entry_point": "add", "prompt": "def add(a, b):\\n"})
    CodeTests.from_record({"test_list": ["assert add(1, 2) == 3"], "test_setup_code": ""})   # MBPP
    CodeTests.from_record(["assert add(1, 2) == 3"])                                         # plain asserts

Every test gets a verdict with its reason: ``passed``, ``failed`` (an assertion), ``error`` (another
exception), ``timeout``, ``memory``, ``file_size``, or, when the program died before reaching it,
``crashed`` / ``killed``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import secrets
import signal
from pathlib import Path
from typing import Any, Iterable

from rlax_core.config import require
from rlax_core.rewards.sandbox import SandboxLimits, SandboxReport, run_sandboxed

DRIVER = Path(__file__).with_name("code_driver.py")
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


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


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
    if tests.entry_point and not re.search(rf"^\s*def\s+{re.escape(tests.entry_point)}\s*\(", code, re.MULTILINE):
        return tests.prompt + code
    imports = [line for line in tests.prompt.splitlines() if re.match(r"(?:import|from)\s+\w", line)]
    return "\n".join(imports + [code]) if imports else code


def run_tests(program: str, tests: CodeTests, limits: SandboxLimits = SandboxLimits(),
              per_test_seconds: float = 5.0) -> CodeResult:
    """Run ``program`` then each test in one sandbox; a verdict for every test."""
    token = secrets.token_hex(16)
    job = {"program": program, "setup": tests.setup, "tests": list(tests.cases), "per_test_seconds": per_test_seconds,
           "token": token}
    report = run_sandboxed({"driver.py": DRIVER.read_text(), "job.json": json.dumps(job)}, ["driver.py"], limits)
    return CodeResult(_verdicts(report, len(tests.cases), limits, token), report.wall_seconds, report.isolated)


def _verdicts(report: SandboxReport, count: int, limits: SandboxLimits, token: str) -> tuple[TestVerdict, ...]:
    found: dict[int, TestVerdict] = {}
    for line in report.results.splitlines():
        signed, _, payload = line.partition(" ")
        if not secrets.compare_digest(signed, token):
            continue  # not written by the driver
        try:
            record = json.loads(payload)
            index, reason = int(record["index"]), str(record["reason"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut at output_bytes
        if 0 <= index < count and reason in VERDICTS and index not in found:
            found[index] = TestVerdict(index, reason, str(record.get("detail", ""))[:400])
    missing = _death(report, limits)
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

    def __init__(self, workers: int = 2, limits: SandboxLimits = SandboxLimits(), per_test_seconds: float = 5.0):
        require(workers >= 1, "workers", "must be >= 1")
        self.limits, self.per_test_seconds = limits, per_test_seconds
        # Threads suffice: each one waits on a child process, which does the work and holds no GIL.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-verifier")

    def check(self, completion: str, tests: CodeTests) -> CodeResult:
        return run_tests(build_program(completion, tests), tests, self.limits, self.per_test_seconds)

    def check_many(self, items: Iterable[tuple[str, CodeTests]]) -> list[CodeResult]:
        """Results in input order."""
        return list(self._pool.map(lambda item: self.check(*item), items))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "CodeVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def humaneval_tests(row: dict[str, Any]) -> CodeTests:
    return CodeTests.from_record({k: row[k] for k in ("test", "entry_point", "prompt")})


def mbpp_tests(row: dict[str, Any]) -> CodeTests:
    return CodeTests.from_record({k: row[k] for k in ("test_list", "test_setup_code", "test_imports") if k in row})
