"""Dependencies point one way: pipelines -> transforms -> rlax_core.

``rlax_core`` never imports Beam (it runs inside a trainer on a TPU slice with no Beam installed);
``transforms`` holds no model math (it wraps ``rlax_core``); nothing below ``pipelines`` imports it.
"""

import ast
from pathlib import Path

import pytest

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
])
def test_dependencies_point_one_way(package, forbidden):
    assert _modules(package), f"{package} has no modules"
    assert _offenders(package, forbidden) == []
