"""A user's own modules, named in a config and imported on every worker before what they register is
built: reward terms (``rewards.modules``), environments and tools (``env.modules``).

A spec is a dotted module name on the Python path or a ``.py`` file (local, or any fsspec URL such as
gs://). A file is imported once per process under a name derived from its path, so importing it
again registers nothing twice. Whatever the module raises comes back as one ``UserModuleError``
naming the spec and the cause.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import threading
from types import ModuleType

from rlax_core.utils.paths import is_remote

_lock = threading.Lock()  # DoFn.setup runs in several threads of one worker


class UserModuleError(ImportError):
    """A configured module or file cannot be imported; says which and why."""


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def import_user_module(spec: str, kind: str = "user") -> ModuleType:
    """The module ``spec`` names, imported once per process; ``kind`` ("reward", "environment") names
    it in an error."""
    if not is_file_spec(spec):
        try:
            return importlib.import_module(spec)
        except Exception as error:  # noqa: BLE001 - whatever the user's module raised, named
            raise UserModuleError(f"{kind} module {spec}: {type(error).__name__}: {error}") from error
    where = spec if is_remote(spec) else os.path.abspath(spec.removeprefix("file://"))
    name = "rlax_user_module_" + hashlib.sha1(where.encode("utf-8")).hexdigest()[:12]
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        source = _read_source(spec, kind)
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=spec))
        module.__file__ = spec
        sys.modules[name] = module
        try:
            exec(compile(source, spec, "exec"), module.__dict__)
        except BaseException as error:
            del sys.modules[name]
            raise UserModuleError(f"{kind} file {spec}: {type(error).__name__}: {error}") from error
        return module


def _read_source(spec: str, kind: str) -> str:
    if is_remote(spec):
        import fsspec

        try:
            with fsspec.open(spec, "r", encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            raise UserModuleError(f"{kind} file {spec}: not found") from None
    path = spec.removeprefix("file://")
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise UserModuleError(f"{kind} file {spec}: {error.strerror or error}") from None
