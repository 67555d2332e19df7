"""Code verification: real HumanEval / MBPP solutions pass, wrong ones fail, hostile ones are contained."""

import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from rlax_core.rewards.code_verifier import (CodeTests, CodeVerifier, build_program, extract_code, humaneval_tests,
                                             mbpp_tests, run_tests)
from rlax_core.sandbox.run import SandboxLimits, run_sandboxed

# Tight limits for hostile programs: they must fail fast and cost the shared machine little.
HOSTILE = SandboxLimits(cpu_seconds=2, wall_seconds=6.0, memory_bytes=256 << 20, file_bytes=4 << 20,
                        workdir_bytes=8 << 20, processes=4)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def humaneval(data_dir):
    return _jsonl(data_dir / "humaneval" / "HumanEval.jsonl")


@pytest.fixture(scope="module")
def mbpp(data_dir):
    return _jsonl(data_dir / "mbpp" / "mbpp.jsonl")


def _processes_of(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # exited while we looked
        uid_line = next(line for line in text.splitlines() if line.startswith("Uid:"))
        if int(uid_line.split()[1]) == uid:
            pids.append(int(status.parent.name))
    return pids


def _hostile(program: str, test: str = "assert True") -> tuple:
    """Run a hostile program with one test; return (verdict, report-like info) after checking no process survives."""
    tests = CodeTests(cases=(test,))
    result = run_tests(program, tests, HOSTILE, per_test_seconds=1.0)
    return result.verdicts[0], result


@pytest.fixture(scope="module", autouse=True)
def isolated_sandbox():
    report = run_sandboxed({"main.py": "print('hi')"}, ["main.py"], HOSTILE)
    if not report.isolated:
        pytest.fail(f"sandbox is not isolated here ({report.isolation_missing}); refusing to run hostile programs")
    assert report.stdout == "hi\n" and report.exit_code == 0


# ----------------------------------------------------------------------------- correctness on real datasets


def test_humaneval_sample_canonical_pass_and_wrong_fail(humaneval):
    sample = humaneval[::16]  # 11 problems across the set; all 164 run in the slow lane
    with CodeVerifier(workers=2) as verifier:
        right = verifier.check_many([(row["canonical_solution"], humaneval_tests(row)) for row in sample])
        # Wrong on purpose: the body returns None, which every HumanEval check rejects.
        wrong = verifier.check_many([("    return None\n", humaneval_tests(row)) for row in sample])
    assert [r.all_passed for r in right] == [True] * len(sample), [r.info() for r in right if not r.all_passed]
    assert not any(r.all_passed for r in wrong)
    assert all(v.reason in ("failed", "error") for r in wrong for v in r.verdicts)


@pytest.mark.slow
def test_humaneval_all_164_canonical_pass(humaneval):
    with CodeVerifier(workers=2) as verifier:
        results = verifier.check_many([(row["canonical_solution"], humaneval_tests(row)) for row in humaneval])
    failing = [(row["task_id"], r.info()) for row, r in zip(humaneval, results) if not r.all_passed]
    assert len(humaneval) == 164 and not failing, failing


@pytest.mark.slow
def test_humaneval_all_164_as_chat_completions_pass(humaneval):
    # The shape a chat model answers in: prose, then the whole function (without the prompt's
    # imports) in a fenced block.
    def chat(row):
        body = "\n".join(line for line in row["prompt"].splitlines() if not line.startswith(("from ", "import ")))
        return f"Here is my solution.\n```python\n{body}\n{row['canonical_solution']}```\nIt works."

    with CodeVerifier(workers=2) as verifier:
        results = verifier.check_many([(chat(row), humaneval_tests(row)) for row in humaneval])
    failing = [(row["task_id"], r.info()) for row, r in zip(humaneval, results) if not r.all_passed]
    assert not failing, failing


@pytest.mark.slow
def test_humaneval_all_164_wrong_solutions_fail(humaneval):
    # Deliberately wrong: a body that never returns an answer.
    with CodeVerifier(workers=2) as verifier:
        results = verifier.check_many([("    raise NotImplementedError\n", humaneval_tests(row)) for row in humaneval])
    assert not any(r.all_passed for r in results)


def test_mbpp_sample_canonical_pass_and_wrong_fail(mbpp):
    sample = mbpp[::80]
    with CodeVerifier(workers=2) as verifier:
        right = verifier.check_many([(row["code"], mbpp_tests(row)) for row in sample])
        wrong = verifier.check_many([(row["code"] + "\n" + _sabotage(row["code"]), mbpp_tests(row)) for row in sample])
    assert all(r.all_passed for r in right), [r.info() for r in right if not r.all_passed]
    assert not any(r.all_passed for r in wrong)


def _sabotage(code: str) -> str:
    """Redefine the solution's first function to return None (the MBPP tests all compare a value)."""
    name = code.split("def ", 1)[1].split("(", 1)[0].strip()
    return f"def {name}(*args, **kwargs):\n    return None\n"


@pytest.mark.slow
def test_mbpp_all_canonical_pass(mbpp):
    # Generous per-test time: a few canonical solutions are slow brute force (task 123 sums amicable numbers).
    limits = SandboxLimits(cpu_seconds=120, wall_seconds=240.0)
    with CodeVerifier(workers=2, limits=limits, per_test_seconds=60.0) as verifier:
        results = verifier.check_many([(row["code"], mbpp_tests(row)) for row in mbpp])
    failing = {row["task_id"]: r.info() for row, r in zip(mbpp, results) if not r.all_passed}
    # Task 126 names its function ``sum``; a test's builtins are always the builtins, so it fails closed.
    assert len(mbpp) == 974 and list(failing) == [126], failing
    assert "the program defines sum, but sum here is the builtin" in failing[126]["verdicts"][0]["detail"]


def test_per_test_verdicts_carry_reasons():
    tests = CodeTests(cases=("assert f(1) == 2", "assert f(2) == 5", "f('x')", "g()"))
    result = run_tests("def f(x):\n    return x + 1\n", tests)
    assert [v.reason for v in result.verdicts] == ["passed", "failed", "error", "error"]
    assert "TypeError" in result.verdicts[2].detail and "NameError" in result.verdicts[3].detail
    assert result.pass_fraction == 0.25 and not result.all_passed


def test_syntax_error_fails_every_test():
    result = run_tests("def f(:\n", CodeTests(cases=("assert True", "assert True")))
    assert [v.reason for v in result.verdicts] == ["error", "error"]
    assert "SyntaxError" in result.verdicts[0].detail


def test_code_extraction_and_prompt_completion():
    assert extract_code("Here:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("def f(): pass") == "def f(): pass"
    tests = CodeTests(cases=("assert f() == 1",), prompt="def f():\n", entry_point="f")
    assert build_program("    return 1\n", tests) == "def f():\n    return 1\n"
    assert build_program("```python\ndef f():\n    return 1\n```", tests) == "def f():\n    return 1\n"
    typed = CodeTests(cases=("assert f([1]) == 1",), prompt="from typing import List\n\n\ndef f(xs: List[int]):\n",
                      entry_point="f")
    program = build_program("def f(xs: List[int]) -> int:\n    return xs[0]\n", typed)
    assert program.startswith("from typing import List\n") and run_tests(program, typed).all_passed


def test_tests_from_record_shapes():
    assert CodeTests.from_record('["assert 1"]').cases == ("assert 1",)
    mbpp_like = CodeTests.from_record({"test_list": ["assert g()"], "test_setup_code": "import math"})
    assert mbpp_like.setup == "import math"
    humaneval_like = CodeTests.from_record({"test": "def check(c): assert c()", "entry_point": "g"})
    assert humaneval_like.cases[0].endswith("check(g)\n") and humaneval_like.entry_point == "g"
    with pytest.raises(ValueError, match="code tests must be"):
        CodeTests.from_record({"bogus": 1})


# ----------------------------------------------------------------------------- hostile programs


def test_infinite_loop_times_out():
    verdict, _ = _hostile("while True:\n    pass\n")
    assert verdict.reason == "timeout"


def test_loop_that_swallows_the_alarm_meets_the_cpu_limit():
    program = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n"
    verdict, _ = _hostile(program)
    assert verdict.reason == "timeout"


def test_fork_bomb_is_contained():
    verdict, _ = _hostile("import os\nwhile True:\n    os.fork()\n")
    assert not verdict.passed


def test_fork_bomb_leaves_no_process_behind():
    report = run_sandboxed({"main.py": "import os\nfor _ in range(3):\n    os.fork()\nimport time\ntime.sleep(60)\n"},
                           ["main.py"], SandboxLimits(cpu_seconds=2, wall_seconds=2.0, processes=8))
    assert report.timed_out
    assert _processes_of(report.uid) == []


def test_allocating_10_gb_fails_with_memory():
    verdict, _ = _hostile("block = bytearray(10 * 1024 ** 3)\n")
    assert verdict.reason == "memory"


def test_writing_a_10_gb_file_stops_at_the_file_size_limit():
    program = ("chunk = b'x' * (1 << 20)\n"
               "with open('big.bin', 'wb') as f:\n"
               "    for _ in range(10 * 1024):\n"
               "        f.write(chunk)\n")
    verdict, _ = _hostile(program)
    assert verdict.reason == "file_size"


def test_many_small_files_stop_at_the_workdir_size():
    program = "for i in range(10 ** 6):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n"
    verdict, _ = _hostile(program)
    assert verdict.reason == "error" and "No space left" in verdict.detail


def test_files_outside_the_sandbox_cannot_be_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-42")
    program = "def leak(path):\n    return open(path).read()\n"
    for path in (str(secret), "/etc/passwd", "/work/main/setup.py", os.path.expanduser("~/.bash_history")):
        verdict, result = _hostile(program, f"print(leak({path!r}))")
        assert verdict.reason == "error" and "No such file" in verdict.detail, (path, verdict)
    listing, _ = _hostile("import os\nprint(os.listdir('/'))\nassert 'etc' in os.listdir('/') or 'work' in os.listdir('/')\n")
    assert listing.reason == "failed"


def test_files_outside_the_sandbox_cannot_be_written(tmp_path):
    import sys
    targets = [tmp_path / "pwned", Path("/pwned-by-sandbox"), Path(sys.base_prefix) / "pwned"]
    for target in targets:
        verdict, _ = _hostile(f"open({str(target)!r}, 'w').write('x')\n")
        assert verdict.reason == "error", verdict
        assert not target.exists()


def test_sockets_reach_nothing():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    connected = []

    def accept():
        try:
            connected.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"
    verdict, _ = _hostile(program)
    outside, _ = _hostile("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n")
    thread.join(timeout=5)
    server.close()
    assert verdict.reason == "error" and "unreachable" in verdict.detail.lower(), verdict
    assert outside.reason == "error" and not connected


def test_killing_the_parent_fails_and_the_host_survives():
    me = os.getpid()
    for attack in (f"os.kill({me}, signal.SIGKILL)", "os.kill(os.getppid(), signal.SIGKILL)",
                   "os.kill(-1, signal.SIGKILL)", f"os.kill({os.getppid()}, signal.SIGKILL)"):
        verdict, _ = _hostile(f"import os, signal\n{attack}\n", "assert False, 'still alive'")
        assert not verdict.passed
    assert os.getpid() == me  # and this process is still here to say so
    os.kill(me, 0)


def test_forked_child_cannot_report_a_pass():
    forged = '{"index": 0, "reason": "passed", "detail": ""}'
    program = ("import os\ndef f():\n    if os.fork() == 0:\n        for fd in range(1, 8):\n            try:\n"
               f"                os.write(fd, ({forged!r} + '\\n').encode())\n            except OSError:\n"
               "                pass\n        os._exit(0)\n    os.wait()\n    return False\n")
    verdict, _ = _hostile(program, "assert f()")
    assert verdict.reason == "failed"


def test_a_test_that_forks_reports_once():
    test = "import os\nif os.fork() == 0:\n    pass\nelse:\n    os.wait()\n    assert False\n"
    verdict, _ = _hostile("", test)
    assert verdict.reason == "failed"


def test_candidate_cannot_write_its_own_verdict():
    forged = '{"index": 0, "reason": "passed", "detail": ""}'
    program = (f"import os\nfor fd in range(1, 8):\n    try:\n        os.write(fd, ({forged!r} + '\\n').encode())\n"
               "    except OSError:\n        pass\nos._exit(0)\n")
    verdict, _ = _hostile(program)
    assert verdict.reason in ("crashed", "error")  # gone, or its line on the program's channel was no answer


def test_pool_of_several_workers_checks_every_program():
    # How much the pool overlaps checks is a speed figure: benchmarks/verify.py measures it.
    tests = CodeTests(cases=("import time\ntime.sleep(0.5)",))
    with CodeVerifier(workers=4) as verifier:
        results = verifier.check_many([("", tests)] * 4)
    assert len(results) == 4 and all(r.all_passed for r in results)


def test_limits_are_validated():
    from rlax_core.config import ConfigError
    with pytest.raises(ConfigError, match="memory_bytes"):
        SandboxLimits(memory_bytes=1)
    with pytest.raises(ConfigError, match="processes"):
        SandboxLimits(processes=0)


def test_sigxcpu_is_reported_as_timeout():
    # A wall limit far above the CPU limit: on a loaded machine one CPU-second can take many wall seconds.
    report = run_sandboxed({"main.py": "while True:\n    pass\n"}, ["main.py"],
                           SandboxLimits(cpu_seconds=1, wall_seconds=120.0))
    assert report.signal in (signal.SIGXCPU, signal.SIGKILL) and not report.timed_out


def _python_world_executable() -> bool:
    import sys

    path = Path(os.path.realpath(sys._base_executable))
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def test_without_isolation_the_limits_and_uid_drop_still_hold():
    # What a host without namespaces gets (isolate=False forces that path here): limits, a private
    # directory and an unprivileged uid, and a report that says isolation is missing.
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=6.0, memory_bytes=256 << 20, isolate=False)
    probe = run_sandboxed({"main.py": ""}, ["main.py"], limits) if _python_world_executable() else None
    if probe is None:
        pytest.skip("this Python install is not executable by other users (needed only without namespaces)")
    report = run_sandboxed({"main.py": "import os\nprint(os.getuid(), os.getcwd())\n"}, ["main.py"], limits)
    uid, cwd = report.stdout.split()
    assert not report.isolated and report.isolation_missing and int(uid) == report.uid != 0
    assert not os.path.exists(cwd)  # the private directory is gone
    # spin() swallows its alarms: the CPU limit ends it, and the call after it times out too.
    program = ("def grab():\n    return len(bytearray(10 * 1024 ** 3))\ndef spin():\n    while True:\n        try:\n"
               "            while True:\n                pass\n        except BaseException:\n            pass\n")
    result = run_tests(program, CodeTests(cases=("grab()", "spin()", "assert grab() == 1")), limits, per_test_seconds=1.0)
    assert [v.reason for v in result.verdicts] == ["memory", "timeout", "timeout"], result.info()


def test_output_flood_is_cut_and_exit_is_not_a_pass():
    flood = run_sandboxed({"main.py": "while True:\n    print('x' * 10000)\n"}, ["main.py"],
                          SandboxLimits(cpu_seconds=1, wall_seconds=3.0, output_bytes=4096))
    assert len(flood.stdout) == 4096 and flood.exit_code != 0
    verdict, _ = _hostile("import sys\nsys.exit(0)\n")
    assert verdict.reason == "error" and "SystemExit" in verdict.detail
    verdict, _ = _hostile("import os\nos._exit(0)\n")
    assert verdict.reason == "crashed"


def test_a_closed_lifeline_stops_a_program_that_would_run_on():
    # What ends a hung program once its judge is done, instead of its wall-clock limit.
    read_end, write_end = os.pipe()
    os.close(write_end)
    program = "import time\nwhile True:\n    try:\n        time.sleep(100)\n    except BaseException:\n        pass\n"
    report = run_sandboxed({"main.py": program}, ["main.py"], SandboxLimits(cpu_seconds=2, wall_seconds=30.0),
                           lifeline=read_end)
    assert report.stopped and not report.timed_out and report.signal == signal.SIGKILL
    assert _processes_of(report.uid) == []
