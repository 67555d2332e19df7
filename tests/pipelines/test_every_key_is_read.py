"""Every key of the run config is read by production code: a key that nothing reads does nothing,
and a user who sets it trains on something other than what they asked for.

The walk covers every field of ``RunConfig``, through every nested section (``loop.sampling``,
``trainer.optimizer``, ``loop.env.python.limits``...). A field counts as read where production code
(``rlax_core``, ``transforms``, ``pipelines``) takes it as an attribute (``config.field``), by
``getattr(x, "field")``, by a dotted ``attrgetter`` path or as the key of a section shipped as a
dict (``limits["processes"]``), outside a ``__post_init__``: checking a value is not using it.
"""

import ast
import dataclasses
import typing
from pathlib import Path

from pipelines.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = ("rlax_core", "transforms", "pipelines")


def config_fields(root: type) -> list[tuple[str, str]]:
    """(dotted path, field name) of every field under ``root``, sections included."""
    out = []

    def walk(cls: type, path: str, above: tuple[type, ...] = ()) -> None:
        if cls in above:  # a section that holds itself: walked once
            return
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            here = f"{path}.{field.name}" if path else field.name
            out.append((here, field.name))
            for nested in _dataclasses_in(hints[field.name]):
                walk(nested, here, (*above, cls))

    walk(root, "")
    return out


def _dataclasses_in(tp) -> list[type]:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    return [cls for arg in typing.get_args(tp) if arg is not type(None) for cls in _dataclasses_in(arg)]


def names_read(files: list[Path]) -> set[str]:
    """Attribute names production code reads outside a ``__post_init__``."""
    read = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        checks = {node for function in ast.walk(tree)
                  if isinstance(function, ast.FunctionDef) and function.name == "__post_init__"
                  for node in ast.walk(function)}
        for node in ast.walk(tree):
            if node in checks:
                continue
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                read.add(node.slice.value)  # a section shipped as a dict (the sandbox's limits)
            elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if name == "getattr" and len(strings) >= 1:
                    read.add(strings[0])
                elif name == "attrgetter":
                    read.update(part for text in strings for part in text.split("."))
    return read


def unread_fields(root: type, files: list[Path]) -> list[str]:
    read = names_read(files)
    return [path for path, name in config_fields(root) if name not in read]


def test_every_field_of_the_run_config_is_read_by_production_code():
    files = [path for package in PRODUCTION for path in sorted((REPO / package).rglob("*.py"))]
    fields = config_fields(RunConfig)
    # The walk reaches the deep sections (so a key there cannot hide).
    assert {"loop.sampling.temperature", "loop.env.python.limits.wall_seconds", "algorithm.dynamic_sampling",
            "trainer.optimizer.learning_rate", "evaluate.generation.sampling.top_k"} <= {p for p, _ in fields}
    assert unread_fields(RunConfig, files) == []


def test_the_walk_finds_a_field_that_nothing_reads(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Inner:
        used_deep: int = 0
        forgotten_deep: int = 0

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner = Inner()
        checked_only: int = 0
        used: bool = False

        def __post_init__(self):
            assert self.checked_only >= 0  # validation is not use

    code = tmp_path / "code.py"
    code.write_text("def run(config):\n    return config.inner.used_deep, getattr(config, 'used')\n")
    assert unread_fields(Outer, [code]) == ["inner.forgotten_deep", "checked_only"]
