"""Completions and episodes meet at one seam: ``rollout.samplers``, chosen once per worker.

The rollout path asks which kind a run samples in ``make_sampler`` only: no ``env is None``,
``episode is None``, ``hasattr`` or ``getattr(engine, ...)`` switches elsewhere. Every use of the
engine goes through ``EngineHost``, and no module outside ``inference/engine.py`` touches one of the
``Engine``'s private names (``inference/episodes.py`` is handed what it needs instead).
"""

import ast
from pathlib import Path

import pytest

from rlax_core.envs.base import EnvConfig
from rlax_core.rollout.samplers import CompletionSampler, EpisodeSampler, make_sampler
from tests.support.rollout_spec import rollout_spec

REPO = Path(__file__).resolve().parents[2]
# Where completions and episodes flow (the engine's own record of a turn that parks is the engine's).
ROLLOUT_PATH = ("rlax_core/rollout", "rlax_core/envs", "transforms/rollout.py", "transforms/inference.py",
                "pipelines/rl_stream.py")
EVERY_PACKAGE = ("rlax_core", "transforms", "pipelines", "benchmarks", "tests")


def _files(*places: str) -> list[Path]:
    out = []
    for place in places:
        path = REPO / place
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def _enclosing_functions(tree: ast.AST) -> dict[ast.AST, str]:
    names = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                names.setdefault(node, function.name)
    return names


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _kind_switches(path: Path) -> list[str]:
    """``X.env is (not) None``, ``row.get("episode") is (not) None``, ``hasattr(...)``, ``getattr(engine, ...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = _enclosing_functions(tree)
    found = []
    for node in ast.walk(tree):
        switch = None
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) \
                and any(_is_none(c) for c in node.comparators):
            left = node.left
            if isinstance(left, ast.Attribute) and left.attr in ("env", "episode"):
                switch = ast.unparse(node)
            if isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute) and left.func.attr == "get" \
                    and left.args and isinstance(left.args[0], ast.Constant) and left.args[0].value == "episode":
                switch = ast.unparse(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if node.func.id == "hasattr" or "engine" in target:
                switch = ast.unparse(node)
        if switch and where.get(node) != "make_sampler":
            found.append(f"{path.name}:{node.lineno}: {switch}")
    return found


def test_the_rollout_path_switches_on_the_kind_of_sampling_in_one_factory():
    switches = [s for path in _files(*ROLLOUT_PATH) for s in _kind_switches(path)]
    assert switches == []
    factory = (REPO / "rlax_core/rollout/samplers.py").read_text()
    assert "spec.loop.env is None" in factory  # the one place that asks


def test_the_switch_finder_finds_switches(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(spec, row, request, engine):\n"
                       "    a = spec.loop.env is None\n    b = row.get('episode') is not None\n"
                       "    c = hasattr(request, 'samples')\n    d = getattr(engine, 'engines', None)\n")
    assert len(_kind_switches(planted)) == 4


def _engine_privates() -> set[str]:
    tree = ast.parse((REPO / "rlax_core/inference/engine.py").read_text(encoding="utf-8"))
    [engine] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Engine"]
    names = {node.name for node in engine.body if isinstance(node, ast.FunctionDef) and node.name.startswith("_")
             and not node.name.startswith("__")}
    names |= {node.attr for node in ast.walk(engine) if isinstance(node, ast.Attribute) and node.attr.startswith("_")
              and isinstance(node.value, ast.Name) and node.value.id == "self" and not node.attr.startswith("__")}
    return names


def _private_reads(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in names
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def test_no_engine_private_is_touched_outside_the_engine():
    privates = _engine_privates()
    assert {"_cache", "_params", "_batch", "_episodes", "_next_order"} <= privates
    outside = [path for path in _files(*EVERY_PACKAGE) if path != REPO / "rlax_core/inference/engine.py"]
    assert [hit for path in outside for hit in _private_reads(path, privates)] == []


def test_rollout_code_calls_the_engine_through_its_host():
    offenders = [f"{path.relative_to(REPO)}: {line.strip()}" for path in _files("rlax_core/rollout", "transforms")
                 for line in path.read_text().splitlines() if "host.engine" in line or "host._engine" in line]
    assert offenders == []


@pytest.mark.parametrize("env, kind", [(None, CompletionSampler),
                                       (EnvConfig(name="word_chain", tools=()), EpisodeSampler)])
def test_a_run_samples_one_kind_chosen_by_its_loop(env, kind):
    sampler = make_sampler(rollout_spec(env=env))
    assert type(sampler) is kind and sampler.compiles_episodes == (env is not None)
