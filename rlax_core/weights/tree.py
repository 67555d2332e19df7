"""Params pytrees (nested dicts of arrays) <-> flat ``{"a/b/c": array}`` maps, the store's tensor names."""

from __future__ import annotations

from typing import Any, Mapping

SEPARATOR = "/"


def flatten_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Nested dicts -> ``{"layers/0/attn/wq": leaf}`` in a stable (sorted) order."""
    flat: dict[str, Any] = {}

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            if not node:
                raise ValueError(f"params: empty mapping at {prefix or '<root>'!r} cannot be stored")
            for key in sorted(node, key=str):
                name = str(key)
                if not name or SEPARATOR in name:
                    raise ValueError(f"params: key {key!r} under {prefix or '<root>'!r} must be non-empty without '/'")
                visit(node[key], f"{prefix}{SEPARATOR}{name}" if prefix else name)
        elif hasattr(node, "shape") and hasattr(node, "dtype"):
            flat[prefix] = node
        else:
            raise TypeError(f"params: {prefix or '<root>'!r} is a {type(node).__name__}, expected a dict or an array")

    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a nested dict of arrays, got {type(params).__name__}")
    visit(params, "")
    return flat


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, leaf in flat.items():
        *parents, last = name.split(SEPARATOR)
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    return tree
