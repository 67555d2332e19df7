"""Typed configuration: dataclasses validated on construction, YAML files, dotted overrides.

Every section of a run is a frozen dataclass owned by the package it configures (the engine owns
``EngineConfig``, the trainer ``TrainerConfig``, ...). A section validates itself in
``__post_init__`` with :func:`require`; this module turns plain mappings (from YAML and from
``key=value`` overrides) into those dataclasses and reports every failure with its full key path::

    config = load_config("configs/quickstart.yaml", ["trainer.optimizer.learning_rate=1e-5"], RunConfig)

Errors name the path and what is allowed, e.g.
``trainer.optimizer.learning_rate: expected a float, got 'fast'`` or
``engine.num_slots: unknown key; allowed: max_new_tokens, num_slots, page_size``.

A key that moved keeps working where it can: a section's ``RENAMED`` maps an old key to its new
place inside the section (``{"temperature": "sampling.temperature"}``), and the old spelling parses
to the same value (both spellings at once is refused, naming the new one). A key whose meaning moved
to another section or went away is in ``REMOVED``, with the one line that says where it went.
"""

from __future__ import annotations

import dataclasses
import math
import stat
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)

    def under(self, parent: str) -> "ConfigError":
        """The same error, its key path prefixed with ``parent``."""
        return ConfigError(_join(parent, self.path), self.message)


class InputError(ValueError):
    """An input a command names (model, data set, eval set) is missing, unreadable, empty or of the wrong schema."""


def require(condition: bool, key: str, message: str) -> None:
    """Validation helper for ``__post_init__``: raise ``ConfigError(key, message)`` unless ``condition``."""
    if not condition:
        raise ConfigError(key, message)


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent and child else parent or child


# ----------------------------------------------------------------------------- building from mappings


def from_dict(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build dataclass ``cls`` from a plain mapping, checking keys and types recursively."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a mapping for {cls.__name__}, got {_show(data)}")
    data = _moved(cls, data, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(_join(path, str(unknown[0])), f"unknown key; allowed: {', '.join(sorted(fields))}")
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as error:
        raise error.under(path) from None
    except TypeError as error:  # a required field is missing
        raise ConfigError(path, str(error)) from None


def _moved(cls: type, data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """``data`` with the old keys of ``cls.RENAMED`` at their new places; an old key of ``cls.REMOVED``
    is refused with its message."""
    for key, message in getattr(cls, "REMOVED", {}).items():
        if key in data:
            raise ConfigError(_join(path, key), message)
    renamed = {old: new for old, new in getattr(cls, "RENAMED", {}).items() if old in data}
    if not renamed:
        return data
    data = _deep_copy(dict(data))
    for old, new in renamed.items():
        *sections, leaf = new.split(".")
        node = data
        for depth, section in enumerate(sections):
            child = node.get(section, {})
            child = to_dict(child) if dataclasses.is_dataclass(child) else child
            if not isinstance(child, Mapping):
                raise ConfigError(_join(path, ".".join(sections[:depth + 1])), f"expected a mapping, got {_show(child)}")
            node[section] = node = dict(child)
        if leaf in node:
            raise ConfigError(_join(path, old), f"set twice, as {_join(path, old)} and as {_join(path, new)}; "
                                                f"write {_join(path, new)} only")
        node[leaf] = data.pop(old)
    return data


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # an optional section: its own error, naming the key inside it
            return _coerce(options[0], value, path)
        errors = []
        for option in options:
            try:
                return _coerce(option, value, path)
            except ConfigError as error:
                errors.append(error.message)
        raise ConfigError(path, " or ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ConfigError(path, f"expected one of {', '.join(map(repr, args))}, got {_show(value)}")
        return value
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value) and isinstance(value, tp):
            return value
        return from_dict(tp, value, path)
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {_show(value)}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            item_types = [args[0]] * len(value)
        elif origin is tuple and args:
            if len(args) != len(value):
                raise ConfigError(path, f"expected {len(args)} items, got {len(value)}")
            item_types = list(args)
        else:
            item_types = [args[0] if args else Any] * len(value)
        items = [_coerce(t, v, f"{path}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"expected a mapping, got {_show(value)}")
        key_type, value_type = args if args else (Any, Any)
        return {_coerce(key_type, k, path): _coerce(value_type, v, _join(path, str(k))) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected true or false, got {_show(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected an integer, got {_show(value)}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML reads 1e-5 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(path, f"expected a number, got {_show(value)}")
        # No setting here means "unbounded" by inf (None says "no limit" where a field allows it), and
        # nan passes every range check written as a comparison: both are refused for every float field.
        if not math.isfinite(number):
            raise ConfigError(path, f"expected a finite number, got {_show(value)}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, f"expected a string, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) < 60 else text[:57] + '...'}"


# ----------------------------------------------------------------------------- YAML and overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a", "b", "c"], VALUE parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part or not part.replace("_", "").replace("-", "").isalnum() for part in key.split(".")):
        raise ConfigError("", f"bad override {text!r}: expected dotted.key=value, "
                              "e.g. trainer.optimizer.learning_rate=1e-5")
    try:
        value = load_yaml_text(raw, f"override {key}") if raw.strip() else ""
    except ConfigError as error:
        raise ConfigError(key, f"cannot parse override value {raw!r}: {error}") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set each ``dotted.key=value`` in a nested mapping (a copy), creating sections as needed."""
    data = _deep_copy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(keys[: depth + 1]), f"is a value, not a section; cannot set {text!r}")
            node = child
        node[keys[-1]] = value
    return data


def _deep_copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def read_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML file as a mapping; ``base: other.yaml`` inherits from a file beside it (MaxText-style).

    An empty file is refused (it is more likely a wrong path or a truncated copy than a wish for
    every default), and so is a ``base:`` chain that comes back to a file it has read. Every file of
    a chain is read by :func:`read_config_text` and parsed by :func:`load_yaml_text`.
    """
    path = Path(path)
    if path.resolve() in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain[_chain.index(path.resolve()):], path.resolve()))
        raise ConfigError("base", f"inheritance cycle: {cycle}")
    data = load_yaml_text(read_config_text(path), str(path))
    if data is None:
        raise ConfigError("", f"{path} is empty; give a mapping of settings (or no --config for the defaults)")
    if not isinstance(data, dict):
        raise ConfigError("", f"{path} must hold a mapping at top level")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError("base", f"in {path}: name the file to inherit from, got {_show(base)}")
    return _merge(read_yaml(path.parent / base, (*_chain, path.resolve())), data)


MAX_CONFIG_BYTES = 1 << 20  # a recipe is a few KB; past this a path names something else (a data file, a device)
MAX_YAML_NODES = 100_000  # values after anchors and aliases are expanded; a recipe has a few hundred
MAX_YAML_DEPTH = 64  # sections within sections; a recipe goes 4 deep (and copying a deeper one recurses)


def check_config_file(path: Path) -> None:
    """Refuse, in one line, a config path that is not a regular file of at most ``MAX_CONFIG_BYTES``
    (a folder, a device such as /dev/zero, a pipe that would block the read): checked before opening."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError("", f"config file not found: {path}") from None
    except OSError as error:
        raise ConfigError("", f"cannot read config file {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError("", f"config file {path} is {_file_kind(info.st_mode)}, not a regular file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError("", f"config file {path} holds {info.st_size:,} bytes; a config is at most "
                              f"{MAX_CONFIG_BYTES:,} (is it a config?)")


def read_config_text(path: Path) -> str:
    """The text of a config file that :func:`check_config_file` accepts (a UTF-8 byte-order mark dropped)."""
    check_config_file(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # a file that grew (or a /proc file that says 0 bytes)
    except OSError as error:
        raise ConfigError("", f"cannot read config file {path}: {error.strerror or error}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"config file {path} holds more than {MAX_CONFIG_BYTES:,} bytes (is it a config?)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError("", f"config file {path} is not UTF-8 text (byte {error.start})") from None


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML's safe loader, refusing what a config file should never hold: a key twice in one mapping
    (YAML keeps the last silently) and anchors and aliases that expand past ``MAX_YAML_NODES``."""

    where = "YAML"

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        _check_expansion(node, self.where)
        return self.construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if first is not None:
                    where = f"twice on line {line}" if first == line else f"at lines {first} and {line}"
                    raise ConfigError("", f"{self.where}: duplicate key {key!r} {where}; YAML would keep the "
                                          "last one without a word")
                lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root, where: str) -> None:
    """Count the nodes ``root`` holds once its aliases are expanded, without expanding them (an alias
    is the node it names: sizes are summed over a graph), and how deep they nest; refuse past
    ``MAX_YAML_NODES``, past ``MAX_YAML_DEPTH`` or a cycle."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else [])
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            depths[id(node)] = 1 + max((depths[id(child)] for child in children), default=0)
            if depths[id(node)] > MAX_YAML_DEPTH:
                raise ConfigError("", f"{where}: nested more than {MAX_YAML_DEPTH} levels deep (line "
                                      f"{node.start_mark.line + 1}); a config holds a few")
            if sizes[id(node)] > MAX_YAML_NODES:
                raise ConfigError("", f"{where}: anchors and aliases expand to more than {MAX_YAML_NODES:,} values "
                                      f"(line {node.start_mark.line + 1}); a config holds far fewer")
            continue
        if id(node) in open_nodes:
            raise ConfigError("", f"{where}: an alias refers to a node that holds it (line {node.start_mark.line + 1})")
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise ConfigError("", f"{where}: an alias refers to a node that holds it "
                                      f"(line {child.start_mark.line + 1})")
            if id(child) not in sizes:
                stack.append((child, False))


def load_yaml_text(text: str, where: str) -> Any:
    """YAML text as plain data, through the one loader every config path takes (files, ``base:``
    chains, override values): ``ConfigError`` for invalid YAML, a duplicate key, an alias bomb."""
    loader = _StrictLoader(text)
    loader.where = where
    try:
        return loader.get_single_data()
    except yaml.YAMLError as error:
        raise ConfigError("", f"{where} is not valid YAML: {' '.join(str(error).split())}") from None
    except RecursionError:
        raise ConfigError("", f"{where}: nested too deeply to be a config") from None
    finally:
        loader.dispose()


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path | None, overrides: Sequence[str], cls: type[T]) -> T:
    """Read YAML (if given), apply overrides, build and validate ``cls``."""
    data = read_yaml(path) if path else {}
    return from_dict(cls, apply_overrides(data, overrides))


def to_dict(config: Any) -> Any:
    """A config as plain data (for logging it beside a run and for YAML round trips)."""
    if dataclasses.is_dataclass(config):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (list, tuple)):
        return [to_dict(v) for v in config]
    if isinstance(config, Mapping):
        return {k: to_dict(v) for k, v in config.items()}
    return config
