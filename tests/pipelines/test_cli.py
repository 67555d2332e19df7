"""`rlax --help` and every subcommand's help work, through the installed console script."""

import shutil
import subprocess
import sys

import pytest

from pipelines.cli import SUBCOMMANDS, main


def _rlax(*args: str) -> subprocess.CompletedProcess:
    script = shutil.which("rlax") or shutil.which("rlax", path=str(__import__("pathlib").Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "pipelines.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def test_top_level_help_lists_every_subcommand():
    result = _rlax("--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and f"rlax {name}" in out
    assert "not available yet" not in out, f"rlax {name} has not landed"


def test_config_errors_are_reported_without_traceback(tmp_path):
    result = _rlax("train", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "config file not found" in result.stderr
    assert "Traceback" not in result.stderr


STORIES = "pipelines/assets/stories260K"
HELDOUT = "pipelines/assets/story_task/heldout.jsonl"
MISSING = "/nonexistent/rlax-input"
REWARD = "loop.rewards.terms={story_word: 1.0}"  # the loop names its reward; these cases are about inputs


@pytest.mark.parametrize("argv, says", [
    (["curate", "--input", f"{MISSING}.jsonl", "--output", "{tmp}/c"], f"input {MISSING}.jsonl: no such file"),
    (["curate", "--input", HELDOUT, "--decontaminate-against", f"{MISSING}.jsonl", "--output", "{tmp}/c"],
     f"eval set {MISSING}.jsonl: no such file"),
    (["filter", "--input", f"{MISSING}.jsonl", "--model", STORIES, "--output", "{tmp}/f"], "no such file"),
    (["filter", "--input", HELDOUT, "--model", MISSING, "--output", "{tmp}/f"], f"model {MISSING}: no such file"),
    (["evaluate", "--model", MISSING, "--eval-set", HELDOUT, "--output", "{tmp}/e"], f"model {MISSING}: no such"),
    (["evaluate", "--model", STORIES, "--eval-set", f"{MISSING}.jsonl", "--output", "{tmp}/e"],
     f"eval set {MISSING}.jsonl: no such file"),
    (["train", f"model.path={MISSING}", "run.output_dir={tmp}/t"], f"{MISSING}: no such file or folder"),
    (["rollout", "--train-set", f"{MISSING}.parquet", REWARD, "run.output_dir={tmp}/r"], "No such file or directory"),
    (["launch", "--train-set", f"{MISSING}.parquet", REWARD, "run.output_dir={tmp}/l"], f"train set {MISSING}.parquet"),
    (["launch", "--train-set", HELDOUT, f"model.path={MISSING}", REWARD, "run.output_dir={tmp}/l"], f"model {MISSING}"),
    (["generate", "--model", MISSING, "--prompt", "hi"], f"{MISSING}: no such"),
    (["generate", "--model", STORIES, "--prompts-file", f"{MISSING}.txt"], "No such file or directory"),
    (["quickstart", "--config", f"{MISSING}.yaml", "--output", "{tmp}/q"], "config file not found"),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_a_missing_input_is_one_line_and_a_non_zero_exit(argv, says, tmp_path, capsys):
    import signal

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # rlax train installs its own
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert lines and lines[-1].startswith(f"rlax {argv[0]}: ") and says in lines[-1], lines[-5:]
    assert not any("Traceback" in line for line in lines)


def test_a_bare_word_is_not_taken_for_a_beam_option(capsys):
    assert main(["train", "trainer.optimizer.learning_rate"]) == 2
    error = capsys.readouterr().err.strip()
    assert "'trainer.optimizer.learning_rate' is neither a flag nor an override" in error and "key=value" in error
    assert "\n" not in error


def _taught_texts():
    """What the CLI teaches: `rlax --help`'s epilog, every docstring of pipelines/ and rlax_core/, and the
    strings of every config / input error hint and flag help there."""
    import ast
    from pathlib import Path

    from pipelines import cli

    yield "rlax --help", cli.EPILOG
    root = Path(__file__).resolve().parents[2]
    for path in sorted(root.glob("pipelines/*.py")) + sorted(root.glob("rlax_core/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if ast.get_docstring(node):
                    yield f"{path.name}: a docstring", ast.get_docstring(node)
            name = getattr(node, "func", None)
            if getattr(name, "id", getattr(name, "attr", None)) in ("ConfigError", "InputError", "require", "add_argument"):
                for part in ast.walk(node):
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        yield f"{path.name}: a hint", part.value


def test_every_override_the_cli_teaches_parses_against_the_run_config():
    import dataclasses
    import re

    from pipelines.config import RunConfig, load_run_config

    sections = "|".join(field.name for field in dataclasses.fields(RunConfig))
    # section.key=value, a value being a word or a bracketed YAML list / mapping; KEY=VALUE placeholders are not examples
    token = re.compile(rf"(?<![\w.-])((?:{sections})\.[a-z_][\w.]*=(?:\[[^\]]*\]|\{{[^}}]*\}}|[^\s`'\"),;]+))")
    taught = {match.group(1).rstrip("."): where for where, text in _taught_texts() for match in token.finditer(text)}
    assert "trainer.optimizer.learning_rate=1e-5" in taught and len(taught) >= 8, taught
    for override, where in taught.items():
        try:
            load_run_config(None, [override])
        except ValueError as error:
            pytest.fail(f"{where} teaches {override!r}, which does not parse: {error}")


def test_no_command_re_enters_the_cli():
    """A command calls other commands' functions (the rehearsal its stages), never `pipelines.cli` again."""
    import ast
    from pathlib import Path

    for path in Path(__file__).resolve().parents[2].glob("pipelines/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            assert "pipelines.cli" not in names or path.name == "cli.py", f"{path.name} imports pipelines.cli"


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_rlax_help_shows_each_module_s_own_summary(name):
    """One source: `rlax --help` reads each module's HELP without importing it."""
    import importlib

    from pipelines.cli import summary

    assert summary(name) == importlib.import_module(SUBCOMMANDS[name]).HELP
