"""A user's own rewards: modules that register terms, and plain functions named in the config.

    rewards:
      modules: [my_project.rewards, /home/me/rewards/story_rules.py]   # imported first: @register_reward
      functions: {concise: "my_project.rewards:concise_score",          # NAME: MODULE_OR_FILE:FUNCTION
                  polite: "gs://bucket/rewards/polite.py:score"}
      terms: {story_word: 1.0, concise: 0.2, polite: 0.1}

A module (a dotted name on the Python path, or a ``.py`` file: local or any fsspec URL such as gs://)
registers ``RewardTerm`` classes with ``@register_reward``. A function is called as
``fn(completion, example)`` and returns a score, a bool (1.0 / 0.0, also its ``pass``), or
``(score, info)`` with a JSON-friendly ``info`` dict (put ``"pass"`` in it for pass@k); it is
registered under its config name. Names follow the registry's rule: one that is taken by another
term is refused.

``import_reward_modules`` is what every place that scores calls before building its terms (the
``Rewarder`` does, so a Beam worker's ``DoFn.setup``, the quickstart and evaluation all do), as seqio
imports ``modules_to_import`` in its workers: a config pickled to a worker carries names, not code.
Modules and files are imported as every user module is (``rlax_core.utils.user_modules``: once per
process), so importing one again registers nothing twice.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from rlax_core.rewards.registry import REWARDS, RewardResult, RewardTerm, Sample, register_reward
from rlax_core.utils.user_modules import UserModuleError, import_user_module

# Packages of this repository whose import registers reward terms (the tasks' terms, e.g. story_word).
BUILTIN_MODULES = ("rlax_core.rewards.terms", "rlax_core.tasks")

_lock = threading.Lock()  # DoFn.setup runs in several threads of one worker
_function_terms: dict[tuple[str, Callable], type[RewardTerm]] = {}


class RewardImportError(ImportError):
    """A configured reward module, file or function cannot be loaded; says which and why."""


def import_reward_module(spec: str) -> ModuleType:
    """A dotted module name or a ``.py`` file (local or fsspec URL), imported once per process."""
    try:
        return import_user_module(spec, "reward")
    except UserModuleError as error:
        raise RewardImportError(str(error)) from error.__cause__


def function_reward(spec: str) -> Callable[..., Any]:
    """``MODULE_OR_FILE:FUNCTION`` -> the function."""
    where, _, attribute = spec.rpartition(":")
    if not where or not attribute or "/" in attribute:
        raise RewardImportError(f"reward function {spec!r}: write MODULE:FUNCTION or path/to/file.py:FUNCTION")
    module = import_reward_module(where)
    function = getattr(module, attribute, None)
    if not callable(function):
        raise RewardImportError(f"reward function {spec!r}: {where} has no function {attribute!r}")
    return function


def register_function_reward(name: str, function: Callable[..., Any]) -> type[RewardTerm]:
    """Register ``function(completion, example)`` as the reward term ``name`` (once per process)."""
    with _lock:
        term = _function_terms.get((name, function))
        if term is None:
            term = type(f"FunctionReward[{name}]", (_FunctionReward,), {"function": staticmethod(function)})
            term.__qualname__ = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', name)}"
            register_reward(name)(term)  # refuses a name another term holds
            _function_terms[(name, function)] = term
        return term


def import_reward_modules(modules: Sequence[str] = (), functions: Mapping[str, str] | None = None) -> None:
    """The built-in task terms, then ``modules``, then ``functions`` registered under their names."""
    for spec in (*BUILTIN_MODULES, *modules):
        import_reward_module(spec)
    for name, spec in (functions or {}).items():
        register_function_reward(name, function_reward(spec))


class _FunctionReward(RewardTerm):
    """A reward term around a plain ``function(completion, example)``."""

    function: Callable[..., Any]

    def score(self, sample: Sample) -> RewardResult:
        value = type(self).function(sample.completion, sample.example)
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
            return RewardResult(float(value[0]), dict(value[1]))
        if isinstance(value, bool):
            return RewardResult(float(value), {"pass": value})
        try:
            return RewardResult(float(value), {})
        except (TypeError, ValueError):
            raise TypeError(f"reward function {type(self).__qualname__} returned {type(value).__name__}; "
                            "expected a number, a bool or (score, info dict)") from None


__all__ = ["BUILTIN_MODULES", "REWARDS", "RewardImportError", "function_reward", "import_reward_module",
           "import_reward_modules", "register_function_reward"]
