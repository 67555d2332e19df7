"""A failed job reads as its cause: the cause line found in a child's log, and one line from every command."""

import signal
import sys
import textwrap

import pytest

from pipelines.cli import main
from pipelines.failures import DEBUG_ENV, JobFailed, cause_line, child_env, job_failed
from pipelines.launch import start_command, wait_for_trainer

SPEC_DUMP = "\n".join(f"    '{key}': {{'driver': 'zarr', 'dtype': 'float32'}}," for key in range(40)) + "\n})>."


def test_the_cause_is_the_exception_line_of_the_last_traceback_not_the_log_tail():
    log = (
        "12:00:01 I rlax_core.training.job: resumed from checkpoint 12\n"
        "Traceback (most recent call last):\n"
        '  File "job.py", line 3, in restore\n'
        "    state = manager.restore(step)\n"
        "ValueError: Data corruption detected reading opt_state.1.0.mu: see TensorStore({\n"
        f"{SPEC_DUMP}\n"
    )
    assert cause_line(log) == "ValueError: Data corruption detected reading opt_state.1.0.mu: see TensorStore({"


def test_of_chained_exceptions_the_outermost_is_the_cause():
    log = textwrap.dedent("""\
        Traceback (most recent call last):
          File "a.py", line 1, in <module>
        KeyError: 'mu'

        During handling of the above exception, another exception occurred:

        Traceback (most recent call last):
          File "a.py", line 3, in <module>
        orbax.checkpoint.Error: could not restore step 12
        12:00:02 I absl: shutting down
        """)
    assert cause_line(log) == "orbax.checkpoint.Error: could not restore step 12"


def test_a_childs_own_one_line_wins_over_its_traceback():
    log = ("Traceback (most recent call last):\n  File \"x\", line 1\nTimeoutError: train step 3: 0 of 2 groups\n"
           "rlax train: error: TimeoutError: train step 3: 0 of 2 groups\n12:00:03 I jax: bye\n")
    assert cause_line(log) == "error: TimeoutError: train step 3: 0 of 2 groups"
    assert cause_line("rlax train: input error: no good checkpoint in /r/checkpoints (...)\n") == \
        "input error: no good checkpoint in /r/checkpoints (...)"
    assert cause_line("12:00:00 I x: starting\n12:00:01 I x: working\n") is None


def test_a_job_that_failed_reads_as_its_cause_and_its_log(tmp_path):
    log = tmp_path / "trainer.log"
    log.write_text("starting\nTraceback (most recent call last):\n  File \"t\", line 1\nRuntimeError: the step "
                   f"diverged: loss is nan at step 7\n{SPEC_DUMP}\n")
    message = str(job_failed("trainer", 1, log))
    assert message == (f"the trainer job exited with code 1: RuntimeError: the step diverged: loss is nan at step 7; "
                       f"its log: {log}")
    assert str(job_failed("rollout", -9, tmp_path / "none.log")).startswith(
        "the rollout job was killed by signal 9: its log says nothing")


def test_a_trainer_that_raises_stops_the_wait_with_its_exception_message(tmp_path):
    script = textwrap.dedent(f"""\
        import sys
        print("12:00:00 I trainer: step 1")
        raise ValueError("checkpoint 12: Data corruption detected in opt_state.1.0.mu\\n" + {SPEC_DUMP!r})
        """)
    trainer = start_command("trainer", [sys.executable, "-c", script], tmp_path / "logs")
    rollout = start_command("rollout", [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "logs")
    try:
        with pytest.raises(JobFailed) as raised:
            wait_for_trainer(trainer, rollout, total_steps=1, metrics_dir=tmp_path / "metrics", timeout_s=60,
                             poll_s=0.1)
    finally:
        rollout.stop(5)
        trainer.stop(5)
    assert str(raised.value) == ("the trainer job exited with code 1: ValueError: checkpoint 12: Data corruption "
                                 f"detected in opt_state.1.0.mu; its log: {tmp_path / 'logs' / 'trainer.log'}")


@pytest.fixture
def failing_command(monkeypatch):
    """``rlax plan`` made to raise what a bug in a command would: a plain exception, deep in its work."""
    import pipelines.plan

    def run(args, beam_args):
        raise ZeroDivisionError("the batch has no rows\nso the mean is undefined")

    monkeypatch.setattr(pipelines.plan, "run", run)
    monkeypatch.delenv(DEBUG_ENV, raising=False)


def test_any_failure_of_a_command_is_one_line_and_exit_1(failing_command, capsys):
    assert main(["plan"]) == 1
    error = capsys.readouterr().err
    assert error == ("rlax plan: error: ZeroDivisionError: the batch has no rows so the mean is undefined "
                     "(--debug shows the traceback)\n")


@pytest.mark.parametrize("how", ["--debug first", "--debug after", "environment"])
def test_debug_shows_the_traceback_before_the_line(failing_command, capsys, monkeypatch, how):
    argv = {"--debug first": ["--debug", "plan"], "--debug after": ["plan", "--debug"], "environment": ["plan"]}[how]
    if how == "environment":
        monkeypatch.setenv(DEBUG_ENV, "1")
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "ZeroDivisionError: the batch has no rows" in lines
    assert lines[-1] == "rlax plan: error: ZeroDivisionError: the batch has no rows so the mean is undefined"


def test_a_child_job_keeps_its_traceback_in_its_log():
    assert child_env({"PATH": "/bin"}) == {"PATH": "/bin", DEBUG_ENV: "1"}


def test_an_interrupt_is_still_130(monkeypatch, capsys):
    import pipelines.plan

    def run(args, beam_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipelines.plan, "run", run)
    assert main(["plan"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err == "rlax plan: interrupted\n"


def test_the_cause_is_read_from_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "trainer.log"
    with open(log, "w") as handle:
        handle.write("12:00:00 I trainer: step done, loss 0.25, tokens 4096\n" * 120_000)  # ~6 MiB before it
        handle.write("Traceback (most recent call last):\n  File \"t\", line 1\nOSError: disk quota\n")
    assert str(job_failed("trainer", 1, log)).startswith("the trainer job exited with code 1: OSError: disk quota;")
