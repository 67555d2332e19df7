"""A package's public names, imported from their modules when first used (PEP 562).

A package ``__init__`` that imports every module it re-exports makes each of its users pay for all of
them: ``pipelines.config`` reads only dataclasses of configs, yet importing ``rlax_core.rl.config``
through an eager ``rlax_core.rl`` imported JAX, at every start of ``rlax curate``, a job with no model
in it. A package hands its names to :func:`lazy_exports` instead::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {
        "config": ["AlgorithmConfig"],
        "objective": ["policy_loss", "value_loss"],
    })

``from rlax_core.rl import policy_loss`` and ``rl.policy_loss`` work as before; the owning module
is imported on the first use of one of its names, and an unknown name is the usual AttributeError.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping, Sequence


def lazy_exports(package: str, owners: Mapping[str, Sequence[str]]) -> tuple[Callable, Callable, list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package``, whose modules ``owners`` maps
    (by name relative to the package) to the public names each defines."""
    owner_of = {name: module for module, names in owners.items() for name in names}

    def __getattr__(name: str):
        if name not in owner_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{owner_of[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(owner_of))

    return __getattr__, __dir__, sorted(owner_of)
