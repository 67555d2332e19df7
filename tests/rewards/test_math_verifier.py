"""Math answer equivalence: the forms answers take, and pathological answers that must not hang."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlax_core.config import ConfigError
from rlax_core.rewards.math_verifier import MathVerifier, MathVerifierConfig, math_equal, plain_number

REPO = Path(__file__).resolve().parents[2]

EQUAL = [
    # fractions and decimals
    ("0.5", "\\frac{1}{2}"), ("\\frac12", "0.5"), ("\\dfrac{3}{4}", "0.75"), ("1/2", "\\frac{1}{2}"),
    ("0.1", "10\\%"),
    # LaTeX forms
    ("3\\sqrt{3}", "\\sqrt{27}"), ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"), ("x^2+2x+1", "(x+1)^2"),
    ("\\{1,2\\}", "\\{2,1\\}"), ("45^\\circ", "45"), ("\\left(3, 4\\right)", "(3,4)"),
    # thousands separators and currency (GSM8K)
    ("1,234", "1234"), ("1234", "1,234.0"), ("\\$1,234.50", "1234.5"), ("1,000,000", "10^6"), ("$5", "5"),
    # units
    ("5", "5 \\text{ cm}"), ("18", "18 dollars"), ("72", "72 \\text{ dollars}"), ("3", "3 hours."),
    # intervals
    ("(1,2]", "\\left(1, 2\\right]"), ("[2,5)", "x \\in [2, 5)"), ("(-\\infty, 3)", "(-\\infty,3)"),
]

NOT_EQUAL = [
    ("[1,2]", "(1,2)"), ("(1,2]", "[1,2)"), ("\\frac{1}{3}", "0.333"), ("2", "3"), ("1,234", "1.234"),
    ("5", "5x"), ("x^2+1", "(x+1)^2"), ("\\{1,2\\}", "\\{1,3\\}"), ("18", "19 dollars"),
]


@pytest.fixture(scope="module")
def verifier():
    # Generous limits: these tests are about verdicts, and a loaded 2-core machine slows sympy down a lot.
    with MathVerifier(MathVerifierConfig(workers=2, timeout_seconds=30.0)) as verifier:
        yield verifier


def test_equivalent_forms(verifier):
    results = verifier.compare_many(EQUAL)
    wrong = [(pair, r) for pair, r in zip(EQUAL, results) if not r.equal]
    assert not wrong


def test_different_answers(verifier):
    results = verifier.compare_many(NOT_EQUAL)
    wrong = [(pair, r) for pair, r in zip(NOT_EQUAL, results) if r.equal]
    assert not wrong
    assert all(r.reason == "not_equal" for r in results)


def test_numbers_never_reach_the_pool(verifier):
    assert verifier.compare("1,234.5", "1234.5000001").reason == "numeric"
    assert verifier.compare("1,234", "1234.0000001").reason == "not_equal"  # an integer gold: exactly
    assert verifier.compare("7", "7").reason == "exact"
    assert plain_number("$-1,234.5") == -1234.5
    assert plain_number("1,23") is None and plain_number("2x") is None and plain_number("9" * 100) is None
    # On raw text of any size (benchmarks/answers.py measures that its time grows linearly).
    assert plain_number(" " * 1_000_000 + "1") is None and plain_number("$" + " " * 1_000_000) is None


PATHOLOGICAL = {
    "exponent tower": "10^{10^{10^{10}}}",
    "huge power": "9^{9^{9}}",
    "huge factorial": "(10^{100})!",
    "deep parentheses": "(" * 1500 + "1" + ")" * 1500,
    "deep fractions": "\\frac{" * 300 + "1" + "}{2}" * 300,
    "megabyte of digits": "9" * 1_000_000,
    "megabyte of braces": "{" * 500_000 + "}" * 500_000,
}


@pytest.fixture(scope="module")
def quick_verifier():
    with MathVerifier(MathVerifierConfig(workers=1, timeout_seconds=3.0)) as verifier:
        # The pool's first use starts the fork server and imports sympy (3 s quiet, more under load);
        # the timeout bounds a comparison, not that start-up, so the timed calls below find it warm.
        assert verifier.compare("\\frac{1}{2}", "0.5").equal
        yield verifier


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_answers_get_a_verdict(quick_verifier, name):
    # The caller gets a verdict (pytest-timeout ends a hang); how long it waits is measured by
    # benchmarks/verify.py (pathological_seconds).
    result = quick_verifier.compare("1", PATHOLOGICAL[name])
    assert not result.equal
    assert result.reason in ("not_equal", "timeout", "too_long", "error")


@pytest.mark.slow
def test_hard_timeout_kills_a_stuck_worker_and_the_pool_recovers():
    # Without math-verify's own alarms, 9^(9^9) is computed in C (minutes, no signal checks): only
    # killing the worker can end it. Long answers are let through so that they reach the workers too.
    config = MathVerifierConfig(workers=1, timeout_seconds=3.0, inner_timeouts=False, max_answer_chars=10 ** 7)
    with MathVerifier(config) as verifier:
        assert verifier.compare("\\frac{1}{2}", "0.5").equal  # warm: the worker is up
        for answer in ("9^{9^{9}}", "2^{2^{40}}", "(" * 1500 + "1" + ")" * 1500, "9" * 1_000_000):
            result = verifier.compare("1", answer)
            assert result.reason in ("timeout", "not_equal", "error") and not result.equal
        assert verifier.compare("9^{9^{9}}", "1").reason == "timeout"
        # The replacement worker answers correctly.
        assert verifier.compare("\\frac{1}{2}", "0.5").equal
        assert not verifier.compare("\\frac{1}{2}", "0.6").equal


def test_math_equal_public_function():
    assert math_equal("\\frac{1}{2}", "0.5")
    assert math_equal("1,234", "1234")
    assert not math_equal("2", "3")


def test_gsm8k_golds_equal_their_plain_forms(data_dir, verifier):
    from rlax_core.rewards.answers import extract_answer

    rows = [json.loads(line) for line in (data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()[:300]]
    golds = [extract_answer(row["answer"]).text for row in rows]
    plain = [gold.replace(",", "") + ".0" for gold in golds]
    assert all(r.equal for r in verifier.compare_many(list(zip(golds, plain))))
    shifted = [str(float(gold.replace(",", "")) + 1) for gold in golds]
    assert not any(r.equal for r in verifier.compare_many(list(zip(golds, shifted))))


def test_config_is_validated():
    with pytest.raises(ConfigError, match="timeout_seconds"):
        MathVerifierConfig(timeout_seconds=0)
    with pytest.raises(ConfigError, match="workers"):
        MathVerifierConfig(workers=0)


def test_competition_golds_match_a_model_style_answer(data_dir, verifier):
    # AIME answers are strings, some zero-padded ("025"); AMC 2023 answers are floats (27.0).
    golds = [row["answer"] for name in ("aime24", "aime25", "amc23")
             for row in map(json.loads, (data_dir / name / "test.jsonl").read_text().splitlines())]
    predictions = [str(int(float(gold))) for gold in golds]
    assert all(r.equal for r in verifier.compare_many([(str(g), p) for g, p in zip(golds, predictions)]))
    assert not any(r.equal for r in verifier.compare_many([(str(g), str(int(float(g)) + 1)) for g in golds]))


def test_many_threads_share_the_workers_while_stuck_ones_are_killed():
    # 9^(9^9) runs in C without signal checks (no inner timer here): only a kill ends it, and the
    # comparisons of the other threads go on, on the worker left and on forks replacing the killed.
    import threading

    config = MathVerifierConfig(workers=2, timeout_seconds=4.0, inner_timeouts=False)
    pairs = [("\\frac{1}{2}", "0.5", True), ("x^2+2x+1", "(x+1)^2", True), ("\\{1,2\\}", "\\{1,3\\}", False),
             ("9^{9^{9}}", "1", None)] * 4
    results = {}
    with MathVerifier(config) as verifier:
        assert verifier.compare("3\\sqrt{3}", "\\sqrt{27}").equal  # the parent is up before the timed calls
        threads = [threading.Thread(target=lambda i=i, g=g, p=p: results.__setitem__(i, verifier.compare(g, p)))
                   for i, (g, p, _) in enumerate(pairs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert verifier.compare("\\frac{1}{2}", "0.6").reason == "not_equal"
    assert len(results) == len(pairs)
    for i, (_, _, equal) in enumerate(pairs):
        assert results[i].reason == "timeout" if equal is None else results[i].equal == equal, (pairs[i], results[i])


def test_a_worker_killed_inside_a_batch_leaves_the_rest_to_its_successor():
    # compare_many sends a worker several comparisons at once; one stuck in C ends in its kill, and
    # the comparisons after it in that batch get their verdicts from the fork that replaces it.
    config = MathVerifierConfig(workers=1, timeout_seconds=4.0, inner_timeouts=False)
    stuck = ("9^{9^{9}}", "1")
    pairs = [("\\frac{1}{2}", "0.5"), stuck, ("x^2+2x+1", "(x+1)^2"), ("\\{1,2\\}", "\\{1,3\\}"), stuck,
             ("3\\sqrt{3}", "\\sqrt{27}")]
    with MathVerifier(config) as verifier:
        assert verifier.compare("\\frac{2}{4}", "0.5").equal  # the parent is up before the timed calls
        results = verifier.compare_many(pairs)
    assert [r.reason for r in results] == ["numeric", "timeout", "symbolic", "not_equal", "timeout", "symbolic"]


def _live_processes_in_group(group: int) -> list[int]:
    live = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or gone meanwhile
        if int(fields[2]) == group and fields[0] != "Z":  # after the command: state, ppid, pgrp
            live.append(int(entry.name))
    return live


def test_workers_end_when_their_caller_is_killed(tmp_path):
    # The caller dies without closing anything (SIGKILL): its workers, even one stuck in C, go with it.
    code = ("import os, signal, threading\n"
            "from rlax_core.rewards.math_verifier import MathVerifier, MathVerifierConfig\n"
            "v = MathVerifier(MathVerifierConfig(workers=2, timeout_seconds=600, inner_timeouts=False))\n"
            "assert v.compare('x^2 + 2x + 1', '(x+1)^2').equal\n"
            "threading.Thread(target=v.compare, args=('9^{9^{9}}', '1'), daemon=True).start()\n"
            "print(v._parent._process.pid, flush=True)\n"
            "threading.Event().wait(1)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    # Files, not pipes: the workers inherit them, and a pipe would keep run() waiting for them to end.
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, stdout=out, stderr=err, timeout=300)
    assert result.returncode == -signal.SIGKILL, (tmp_path / "err").read_text()[-2000:]
    group = int((tmp_path / "out").read_text().split()[0])  # the workers' parent leads their process group
    deadline = time.monotonic() + 60
    while _live_processes_in_group(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _live_processes_in_group(group)


def test_a_worker_parent_killed_between_calls_is_replaced():
    import os

    with MathVerifier(MathVerifierConfig(workers=1, timeout_seconds=10.0)) as verifier:
        assert verifier.compare("\\frac{1}{2}", "0.5").equal
        parent = verifier._parent
        os.killpg(parent._process.pid, signal.SIGKILL)  # the parent and its workers, as a stray kill would
        parent._process.wait(timeout=10)
        # The slot's worker died with it: its comparison may come back as an error, never a raise; the
        # next one is served by a fresh parent's worker.
        verifier.compare("\\sqrt{4}", "2")
        assert verifier.compare("\\frac{1}{3}", "\\frac{2}{6}").equal
        assert verifier._parent is not parent


def test_a_worker_that_ended_is_never_signalled_by_its_bare_pid(monkeypatch):
    # Workers are reaped by the kernel as they end, so a worker's pid may name another process by the
    # time the caller kills it; the kill goes through the pidfd taken when it was forked.
    import os

    import psutil

    verifier = MathVerifier(MathVerifierConfig(workers=1, timeout_seconds=10.0))
    try:
        assert verifier.compare("\\frac{1}{2}", "0.5").equal  # a worker is up, waiting in its slot
        (worker,) = psutil.Process(verifier._parent._process.pid).children()
        worker.kill()
        worker.wait(timeout=10)
    finally:
        signalled = []
        monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append(pid))
        verifier.close()  # kills the slot's worker
    assert signalled == []
