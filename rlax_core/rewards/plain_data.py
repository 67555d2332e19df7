"""Plain data across the code sandbox's channel: builtin values as JSON, every other object as a handle.

Standard library only: the program's side (``code_driver.py``) and the judge's side (``code_judge.py``)
load this file inside their sandboxes. ``encode`` runs beside the program, so nothing it does is
trusted; ``decode`` runs in the judge and is the gate: whatever bytes arrive, it builds only values of
builtin types (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``,
``tuple``, ``dict``, ``set``, ``frozenset``, ``range``, a list iterator, the three ``collections``
dicts, one of those types itself or a builtin exception class) or an opaque handle that the caller
makes (``make_handle``), bounded in depth and size. A program can therefore claim a value only by
sending one that a plain function could have returned.

Wire form: JSON, where ``None``/``bool``/``str``/finite ``float``/small ``int`` and ``list`` are
themselves, and everything else is an object with a ``"$"`` tag. ``Counter``, ``OrderedDict`` and
``defaultdict`` travel as dicts and are rebuilt from the judge's own ``collections``; a builtin
data type or exception class (``int`` passed as an argument) travels by name. A container the
receiver already holds (an argument of the call being answered) may travel as ``{"$": "ref"}``, which
decodes only through the receiver's own ``refs``: to that very object, or to nothing.
"""

import builtins
import collections
import json
import math

MAX_DEPTH = 100
BIG_INT_BITS = 4096  # larger ints travel as hex: Python refuses decimal strings over 4300 digits
ITERATOR_ITEMS = 100_000  # an iterator the program returns is drained up to this many items


class NotPlainData(TypeError):
    """A value that cannot cross the channel (raised on the sending side)."""


class BadWireData(ValueError):
    """Bytes that do not decode to plain data (raised on the receiving side)."""


def encode(value, handle_of=None) -> str:
    """JSON text for ``value``; ``handle_of(obj) -> (number, type name)`` for objects, else they are refused."""
    return dump(to_wire(value, handle_of))


def dump(wire) -> str:
    return json.dumps(wire, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def to_wire(value, handle_of=None, shared=None):
    """The JSON-ready form of ``value`` (see ``encode``).

    ``shared``: ``id(container) -> tag`` for containers the receiver already holds (the arguments of
    the call this value answers): each is sent as a reference, so the receiver keeps its identity.
    """
    return _to_wire(value, handle_of, 0, shared)


_MUTABLE = (list, dict, set, bytearray)


def _to_wire(value, handle_of, depth, shared=None):
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if shared and isinstance(value, _MUTABLE) and id(value) in shared:
        return {"$": "ref", "v": shared[id(value)]}
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if value.bit_length() <= BIG_INT_BITS else {"$": "int", "v": hex(value)}
    if kind is float:
        return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
    if kind is list:
        return [_to_wire(item, handle_of, depth + 1, shared) for item in value]
    if kind in (tuple, set, frozenset):
        items = [_to_wire(item, handle_of, depth + 1, shared) for item in value]
        return {"$": kind.__name__, "v": items}
    if kind is dict or kind in _DICTS.values():
        wire = {"$": "dict", "v": [[_to_wire(k, handle_of, depth + 1, shared), _to_wire(v, handle_of, depth + 1, shared)]
                                    for k, v in value.items()]}
        if kind is not dict:
            wire["as"] = kind.__name__  # rebuilt as the standard library's own class (a defaultdict without its factory)
        return wire
    if kind is complex:
        return {"$": "complex", "v": [_to_wire(value.real, None, depth + 1), _to_wire(value.imag, None, depth + 1)]}
    if kind in (bytes, bytearray):
        return {"$": kind.__name__, "v": value.hex()}
    if kind is range:
        return {"$": "range", "v": [value.start, value.stop, value.step]}
    if kind.__name__ in ("list_iterator", "tuple_iterator", "generator", "map", "filter", "zip", "enumerate",
                         "reversed", "list_reverseiterator", "range_iterator", "str_ascii_iterator"):
        items = []
        for item in value:
            if len(items) == ITERATOR_ITEMS:
                raise NotPlainData(f"an iterator longer than {ITERATOR_ITEMS} items")
            items.append(_to_wire(item, handle_of, depth + 1, shared))
        return {"$": "iter", "v": items}
    if _BUILTIN_TYPES.get(getattr(value, "__name__", None)) is value:
        return {"$": "builtin", "v": value.__name__}  # ``int`` as an argument: the judge has its own
    if handle_of is None:
        raise NotPlainData(f"a {kind.__name__} object is not plain data")
    number, type_name = handle_of(value)
    return {"$": "object", "handle": number, "type": type_name}


def decode(text, make_handle=None, max_bytes=None):
    """The value ``text`` encodes; ``make_handle(number, type name)`` turns object tags into the caller's handles."""
    if max_bytes is not None and len(text) > max_bytes:
        raise BadWireData(f"more than {max_bytes} bytes")
    return from_wire(load(text), make_handle)


def load(text):
    """Parsed JSON, or ``BadWireData``: too deep, not JSON, or an int too long for a decimal string."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise BadWireData(f"not JSON: {str(error)[:200]}") from None


def _refuse_constant(name):
    raise ValueError(f"{name} is written {{'$': 'float', ...}} here")


def from_wire(wire, make_handle=None, refs=None):
    """The value of a JSON-ready form (see ``decode``); ``refs(tag)`` resolves a reference (``to_wire``'s
    ``shared``) to the receiver's own object, and without it a reference is bad data."""
    return _from_wire(wire, make_handle, 0, refs)


_TAGS = {"tuple": tuple, "set": set, "frozenset": frozenset}
_DICTS = {cls.__name__: cls for cls in (collections.Counter, collections.OrderedDict, collections.defaultdict)}
# Only data types and exception classes: a builtin function such as ``eval`` or ``getattr`` must never
# reach the judge as a value the program chose.
_BUILTIN_TYPES = {cls.__name__: cls for cls in (None.__class__, bool, int, float, complex, str, bytes, bytearray,
                                                 list, tuple, dict, set, frozenset, range)}
_BUILTIN_TYPES.update({name: cls for name, cls in vars(builtins).items()
                       if isinstance(cls, type) and issubclass(cls, BaseException)})


def _from_wire(wire, make_handle, depth, refs=None):
    if depth > MAX_DEPTH:
        raise BadWireData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(wire)
    if wire is None or kind in (bool, int, float, str):
        return wire
    if kind is list:
        return [_from_wire(item, make_handle, depth + 1, refs) for item in wire]
    if kind is not dict or type(wire.get("$")) is not str:
        raise BadWireData(f"unexpected {kind.__name__}")
    tag, body = wire["$"], wire.get("v")
    try:
        if tag in _TAGS and type(body) is list:
            return _TAGS[tag](_from_wire(item, make_handle, depth + 1, refs) for item in body)
        if tag == "iter" and type(body) is list:
            return iter([_from_wire(item, make_handle, depth + 1, refs) for item in body])
        if tag == "dict" and type(body) is list and all(type(pair) is list and len(pair) == 2 for pair in body):
            items = {_from_wire(k, make_handle, depth + 1, refs): _from_wire(v, make_handle, depth + 1, refs) for k, v in body}
            if "as" not in wire:
                return items
            cls = _DICTS[wire["as"]]
            return cls(None, items) if cls is collections.defaultdict else cls(items)
        if tag == "builtin" and type(body) is str and body in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[body]
        if tag == "int" and type(body) is str:
            return int(body, 16)
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "complex" and type(body) is list and len(body) == 2:
            parts = [_from_wire(part, None, depth + 1) for part in body]
            if all(type(part) is float for part in parts):
                return complex(*parts)
        if tag in ("bytes", "bytearray") and type(body) is str:
            return (bytes if tag == "bytes" else bytearray).fromhex(body)
        if tag == "range" and type(body) is list and len(body) == 3 and all(type(n) is int for n in body):
            return range(*body)
        if tag == "ref" and refs is not None:
            return refs(body)
        if tag == "object" and make_handle is not None and type(wire.get("handle")) is int:
            return make_handle(wire["handle"], str(wire.get("type", "object"))[:100])
    except (TypeError, ValueError, KeyError) as error:  # an unhashable key, a malformed pair, bad hex...
        raise BadWireData(f"bad {tag!r} value: {str(error)[:200]}") from None
    raise BadWireData(f"unknown or malformed tag {str(tag)[:40]!r}")
