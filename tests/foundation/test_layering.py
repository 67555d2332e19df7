"""Dependencies point one way: pipelines -> transforms -> rlax_core, with no circles.

``rlax_core`` never imports Beam (it runs inside a trainer on a TPU slice with no Beam installed);
``transforms`` holds no model math (it wraps ``rlax_core``); nothing below ``pipelines`` imports it.
Inside ``rlax_core``, the engine and the trainer meet only below both (``rlax_core.parallel``).
No module imports one that imports it back, however indirectly; and ``rlax train`` (with every
recipe's config) runs in a process where importing Beam fails.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlax_core.data.rollout_store import GroupKey, RolloutStore

REPO = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(REPO)} imports {name}"
            for path in _modules(package) for name in sorted(_imports(path))
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


@pytest.mark.parametrize("package, forbidden", [
    ("rlax_core", ("apache_beam", "transforms", "pipelines")),
    ("transforms", ("pipelines", "jax.numpy", "flax", "optax")),
    # The engine and the trainer share the mesh through rlax_core.parallel, not through each other.
    ("rlax_core/inference", ("rlax_core.training",)),
    ("rlax_core/parallel", ("rlax_core.training", "rlax_core.inference")),
])
def test_dependencies_point_one_way(package, forbidden):
    assert _modules(package), f"{package} has no modules"
    assert _offenders(package, forbidden) == []


def test_no_module_imports_another_modules_private_names():
    # What another module calls is public; a private name reached from outside hides a dependency.
    private = [f"{path.relative_to(REPO)} imports {node.module}.{alias.name}"
               for package in ("rlax_core", "transforms", "pipelines") for path in _modules(package)
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
               and node.module.split(".")[0] in ("rlax_core", "transforms", "pipelines")
               for alias in node.names if alias.name.startswith("_")]
    assert private == []


def test_transforms_stay_thin_shells():
    # The logic lives in rlax_core; a DoFn module that grows past this holds logic of its own.
    long = {str(path.relative_to(REPO)): n for path in _modules("transforms")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 250}
    assert long == {}


# ---------------------------------------------------------------------------- no import circles

PACKAGES = ("rlax_core", "transforms", "pipelines")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports, wherever the import stands (module level, function, TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` names the module pkg.sub when there is one, else names from pkg
            candidates = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                          for alias in node.names]
        else:
            continue
        found.update(name for name in candidates if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports. A package's ``__init__`` only hands names on: its own
    imports of its submodules are not edges (else every submodule that imports a sibling through the
    package would close a loop that Python resolves by design)."""
    paths = {_module_name(path): path for package in PACKAGES for path in _modules(package)}
    modules = set(paths)
    return {name: (set() if path.name == "__init__.py" else _project_imports(path, modules) - {name})
            for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found():
    # The check itself: a loop of three and a self-contained pair are reported, a chain is not.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_among_the_project_modules():
    graph = import_graph()
    assert "pipelines.config" in graph and "rlax_core.rewards.registry" in graph
    assert circles(graph) == []


# ---------------------------------------------------------------------------- rlax train without Beam

BLOCK_BEAM = """
import sys

class BlockBeam:
    def find_spec(self, name, path=None, target=None):
        if name == "apache_beam" or name.startswith("apache_beam."):
            raise ImportError(f"apache_beam is blocked in this process (imported as {name})")

sys.meta_path.insert(0, BlockBeam())
"""


def _without_beam(code: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", BLOCK_BEAM + code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_blocker_blocks_beam(tmp_path):
    done = _without_beam("import apache_beam", tmp_path, 120)
    assert done.returncode != 0 and "apache_beam is blocked" in done.stderr


def test_every_recipe_loads_without_beam(tmp_path):
    code = ("from pathlib import Path\nfrom pipelines.config import load_run_config\nimport pipelines.train\n"
            f"for path in sorted(Path({str(REPO / 'configs')!r}).glob('*.yaml')):\n"
            "    try:\n        load_run_config(path)\n"
            "    except Exception as error:  # a pipeline-only file may not be a whole run config\n"
            "        assert 'apache_beam' not in repr(error), (path, error)\n"
            "print('loaded')\n")
    done = _without_beam(code, tmp_path, 300)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow  # compiles a train step of stories260K (about a minute on 2 busy cores)
def test_rlax_train_runs_with_beam_blocked(tmp_path):
    output = tmp_path / "run"
    store = RolloutStore(output / "rollouts", "quickstart")
    rng = np.random.default_rng(0)
    for step in range(2):
        key = GroupKey(step, 0)
        rows = [dict(example_id="ex0", group_id=store.group_id(key), sample_idx=j, policy_version=step, seed=j,
                     prompt_ids=[1, 403, 407, 261, 378], completion_ids=[int(t) for t in rng.integers(3, 512, 6)],
                     behavior_logprobs=[-1.0] * 6, finish_reason="length", reward=float(j % 2), reward_info="{}")
                for j in range(4)]
        store.write_group(key, rows)
    overrides = [f"run.output_dir={output}", "trainer.total_steps=2", "trainer.groups_per_step=1",
                 "trainer.max_seq_len=16", "trainer.checkpoint_every=1", "trainer.wait_timeout_s=120",
                 "trainer.poll_s=0.1"]
    code = ("import sys\nfrom pipelines.cli import main\n"
            f"code = main(['train', '--config', {str(REPO / 'configs/quickstart.yaml')!r}, *{overrides!r}])\n"
            "assert 'apache_beam' not in sys.modules\nsys.exit(code)\n")
    done = _without_beam(code, tmp_path, 900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert (output / "checkpoints" / "2").is_dir(), sorted(p.name for p in (output / "checkpoints").iterdir())


def test_tests_use_only_the_sandboxs_public_names():
    """The sandbox is the isolation boundary: its tests go through what callers may use, so that a
    change of its insides cannot keep a test green while a caller breaks."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlax_core.sandbox"):
                offenders += [f"{path.relative_to(REPO)} imports {node.module}.{alias.name}"
                              for alias in node.names if alias.name.startswith("_")]
    assert not offenders, offenders
