"""Merging Beam flags: the config's, then the command line's, in a module that imports no Beam.

Most options are one value, and the command line's replaces the config's key by key. Two are sets
of entries, repeated on a command line (``--experiments=a --experiments=b``): ``experiments`` and
``dataflow_service_options``. Those merge as sets, so adding ``--experiments=x`` or
``--dataflow_service_options=automatically_use_created_reservation`` keeps the recipe's accelerator
and its one SDK process per VM. An entry is known by its key: ``worker_accelerator=type:...`` on the
command line replaces the config's ``worker_accelerator=...``, and ``use_multiple_sdk_containers``
replaces ``no_use_multiple_sdk_containers`` (one setting, said two ways). Removing an entry is said
explicitly: ``--drop_experiments=NAME`` or ``--drop_dataflow_service_options=KEY``. A job whose
config names an accelerator never loses it: dropping ``worker_accelerator`` is refused.
"""

from __future__ import annotations

from typing import Sequence

from rlax_core.config import ConfigError

SET_OPTIONS = ("experiments", "dataflow_service_options")
DROP = "drop_"  # --drop_experiments=NAME, --drop_dataflow_service_options=KEY
ACCELERATOR = "worker_accelerator"


def flag_groups(args: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """``[(key, tokens)]``: ``--key=value``, ``--key value`` and ``--flag`` each one group; a stray word alone."""
    groups: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            groups.append((None, [token]))
            i += 1
            continue
        name = token[2:].split("=", 1)[0].replace("-", "_")
        takes_next = "=" not in token and i + 1 < len(args) and not args[i + 1].startswith("--")
        groups.append((name, list(args[i:i + 1 + takes_next])))
        i += 1 + takes_next
    return groups


def has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _value(tokens: list[str]) -> str:
    return tokens[0].split("=", 1)[1] if "=" in tokens[0] else (tokens[1] if len(tokens) > 1 else "")


def entry_key(entry: str) -> str:
    """What an entry of a set option sets: ``worker_accelerator`` for ``worker_accelerator=type:x``,
    ``use_multiple_sdk_containers`` for ``no_use_multiple_sdk_containers`` too."""
    return entry.split("=", 1)[0].removeprefix("no_")


def set_entries(args: Sequence[str], option: str) -> list[str]:
    """The entries ``args`` give the set option ``option`` (e.g. ``dataflow_service_options``), in order."""
    return [_value(tokens) for key, tokens in flag_groups(args) if key == option]


def merge_beam_args(config_args: Sequence[str], command_line_args: Sequence[str]) -> list[str]:
    """The config's Beam flags and the command line's, merged (see the module docstring).

    A single-valued key given on the command line replaces the config's; the config's other keys
    stay. ``--key value`` and ``--key=value`` are the same key, and so are ``--job-server-timeout``
    and ``--job_server_timeout``. Set options keep the config's entries the command line neither
    replaces (same :func:`entry_key`) nor drops, then add the command line's.
    """
    command_line = flag_groups(command_line_args)
    drops = {option: {entry_key(_value(tokens)) for key, tokens in command_line if key == DROP + option}
             for option in SET_OPTIONS}
    replaced = {option: {entry_key(entry) for entry in set_entries(command_line_args, option)} | drops[option]
                for option in SET_OPTIONS}
    given = {key for key, _ in command_line if key and key not in SET_OPTIONS}
    merged: list[str] = []
    for key, tokens in flag_groups(config_args):
        if key in SET_OPTIONS:
            if entry_key(_value(tokens)) not in replaced[key] and _value(tokens) not in set_entries(merged, key):
                merged += tokens
        elif key not in given:
            merged += tokens
    for key, tokens in command_line:
        if key in SET_OPTIONS and _value(tokens) in set_entries(merged, key):
            continue
        if key is None or not key.startswith(DROP) or key[len(DROP):] not in SET_OPTIONS:
            merged += tokens
    _keep_the_accelerator(config_args, merged)
    return merged


def _keep_the_accelerator(config_args: Sequence[str], merged: Sequence[str]) -> None:
    """A job whose config names an accelerator is never translated without one."""
    named = [e for e in set_entries(config_args, "dataflow_service_options") if entry_key(e) == ACCELERATOR]
    kept = [e for e in set_entries(merged, "dataflow_service_options") if entry_key(e) == ACCELERATOR]
    if named and not kept:
        raise ConfigError(f"--{DROP}dataflow_service_options", f"the config runs this job on {named[0]}; "
                          f"a job without its accelerator would load the model on CPUs: name another one with "
                          f"--dataflow_service_options={ACCELERATOR}=... instead of dropping it")
