"""``Registry``: names to things a config selects by name (reward terms, environments, tools,
algorithm presets, advantage estimators), each name taken once.

    TOOLS = Registry("tool")

    @TOOLS.register("calculator")
    class Calculator(Tool): ...

A second registration under a taken name is refused, naming what holds it; registering the same
object again (a module imported twice) is a no-op. Lookups are a dict's.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Registry(dict):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def add(self, name: str, value: Any) -> None:
        held = self.get(name)
        if held is not None and held is not value:
            what = getattr(held, "__qualname__", None) or type(held).__qualname__
            raise ValueError(f"{self.kind} {name!r} is already registered by {what}")
        self[name] = value

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register(name)`` adds the decorated class or function under ``name``."""

        def decorate(value: T) -> T:
            self.add(name, value)
            return value

        return decorate

    def names(self) -> list[str]:
        return sorted(self)
