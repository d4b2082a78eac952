"""Channel items <-> JSON: every item an engine source publishes (app/source/channel.py, the engine's
EngineStepEvent / MemorySnapshot / BlockMapSnapshot, EngineInfo) as one JSON object.

Only the classes in REGISTRY are ever built from a file (a recording names a class, never a module), and
each field is rebuilt by its type hint: enums from their values, tuples from lists, integer keys from JSON's
string keys, and a value of the wrong kind refused (BadItem), so a lying file cannot hand a panel a string
where it adds numbers.

A step's RequestOutputs are written as deltas: `token_ids` and `text` (everything so far, growing with each
token: quadratic over a request) are left out and rebuilt by the Decoder from the new tokens and text (the ids
into one list per request, each output a TokenIds view of it, as the engine hands them out).
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import cast

from app.remote import facts as remote_facts
from app.source import channel
from app.source.engine_info import Capabilities, EngineInfo
from engine import events
from engine.token_ids import AppendOnlyIds, TokenIds

_CLASSES = [
    events.EngineStepEvent, events.StepStats, events.RequestOutput, events.TokenLogprob, events.RequestTimeline,
    events.SpecDecodeStats, events.LoraPoolEvent, events.LoraPoolSnapshot, events.MemorySnapshot,
    events.BlockMapSnapshot, events.BlockInfo, events.TradeoffPoint, EngineInfo, Capabilities,
    remote_facts.ServerFacts, remote_facts.BucketPercentiles,
    *(c for c in vars(channel).values() if isinstance(c, type) and dataclasses.is_dataclass(c)),
]
REGISTRY: dict[str, type] = {c.__name__: c for c in _CLASSES}
DELTA_FIELDS = ("token_ids", "text")  # RequestOutput's running totals, rebuilt on reading
MAX_STREAMS = 4096  # requests whose running totals the decoder keeps (a file that never finishes its requests)
MAX_DEPTH = 16  # nesting of one item (ours go 5 deep)


class BadItem(ValueError):
    """A line that is JSON but not an item this version can build."""


def encode(item) -> dict:
    """An item (a registered dataclass) as a JSON-ready dict; its class is the line's kind."""
    return _fields(item, top=True)


def _fields(obj, top: bool = False) -> dict:
    out = {} if top else {"_t": type(obj).__name__}
    skip = DELTA_FIELDS if type(obj) is events.RequestOutput else ()
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        out[f.name] = _value(getattr(obj, f.name))
    return out


def _value(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v.value if isinstance(v, enum.Enum) else v
    if isinstance(v, enum.Enum):
        return v.value
    if dataclasses.is_dataclass(v):
        return _fields(v)
    if isinstance(v, Mapping):
        return {str(k): _value(x) for k, x in v.items()}
    if isinstance(v, (tuple, list, frozenset, set)):
        return [_value(x) for x in v]
    return str(v)  # a knob value of another kind (a path): shown as text


class Decoder:
    """Builds items from decoded JSON; keeps each live request's running token ids and text. Each class's
    fields get a converter made once from their type hints (a replay decodes thousands of items a second)."""

    def __init__(self) -> None:
        self._streams: OrderedDict[str, tuple[AppendOnlyIds, str]] = OrderedDict()

    def item(self, kind: str, data) -> object:
        cls = REGISTRY.get(kind)
        if cls is None:
            raise BadItem(f"unknown item kind {kind[:40]!r}")
        if not isinstance(data, dict):
            raise BadItem(f"{kind}: not an object")
        return self._build(cls, data, 0)

    def _build(self, cls: type, data: dict, depth: int):
        if depth > MAX_DEPTH:
            raise BadItem("nested too deep")
        fields = _field_converters(cls)
        kwargs = {}
        for name, value in data.items():
            convert = fields.get(name)
            if convert is None:
                if name == "_t":
                    continue
                raise BadItem(f"{cls.__name__} has no field {str(name)[:40]!r}")
            kwargs[name] = convert(self, value, depth + 1)
        if cls is events.RequestOutput:
            kwargs.update(self._totals(kwargs))
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field missing
            raise BadItem(f"{cls.__name__}: {exc}") from None

    def _totals(self, kw: dict) -> dict:
        rid = kw.get("request_id", "")
        ids, text = self._streams.pop(rid) if rid in self._streams else (AppendOnlyIds(), "")
        ids.extend(kw.get("new_token_ids", ()))
        text += kw.get("new_text", "")
        if not kw.get("finished"):
            self._streams[rid] = (ids, text)
            if len(self._streams) > MAX_STREAMS:
                self._streams.popitem(last=False)
        return {"token_ids": TokenIds(ids), "text": text}

    def generic(self, value, depth: int):
        """A field typed `object` (a ServerSample's facts, a ClientOutput's output) or a plain dict's value (a
        config, a comparison's result): a registered class by its `_t`, else plain JSON as it was."""
        if depth > MAX_DEPTH:
            raise BadItem("nested too deep")
        if isinstance(value, dict):
            name = value.get("_t")
            if name is not None:
                cls = REGISTRY.get(name) if isinstance(name, str) else None
                if cls is None:
                    raise BadItem(f"unknown class {str(name)[:40]!r}")
                return self._build(cls, value, depth + 1)
            return {k: self.generic(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.generic(v, depth + 1) for v in value]
        return value


Converter = typing.Callable[[Decoder, object, int], object]
_FIELDS: dict[type, dict[str, Converter]] = {}


def _field_converters(cls: type) -> dict[str, Converter]:
    fields = _FIELDS.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls)
        fields = _FIELDS[cls] = {f.name: _converter(hints[f.name], f"{cls.__name__}.{f.name}")
                                 for f in dataclasses.fields(cls)}
    return fields


def _bad(where: str, what: str):
    raise BadItem(f"{where}: {what}")


_PRIMITIVE_OK = {bool: lambda v: type(v) is bool, int: lambda v: type(v) is int,
                 float: lambda v: type(v) in (float, int), str: lambda v: type(v) is str}


def _converter(hint, where: str) -> Converter:  # noqa: C901 (one branch per kind of hint)
    """A function (decoder, JSON value, depth) -> the field's value, checked against `hint`."""
    if hint in (object, typing.Any):
        return lambda d, v, depth: d.generic(v, depth)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_converter(a, where) for a in args if a is not type(None)]
        nullable = type(None) in args

        def union(d, v, depth):
            if v is None and nullable:
                return None
            for convert in options[:-1]:
                try:
                    return convert(d, v, depth)
                except BadItem:
                    continue
            return options[-1](d, v, depth)
        return union
    if origin in (frozenset, Sequence) or origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        each, make = _converter(args[0], where), frozenset if origin is frozenset else tuple
        return lambda d, v, depth: (make(each(d, x, depth + 1) for x in v) if type(v) is list
                                    else _bad(where, "expected a list"))
    if origin is tuple:
        parts = [_converter(a, where) for a in args]

        def fixed(d, v, depth):
            if type(v) is not list or len(v) != len(parts):
                _bad(where, f"expected a list of {len(parts)}")
            return tuple(c(d, x, depth + 1) for c, x in zip(parts, v))
        return fixed
    if origin in (dict, Mapping) or hint is dict:
        key_t, val_t = args or (str, object)
        value = _converter(val_t, where)
        key = (lambda k: int(k) if k.lstrip("-").isdigit() else _bad(where, "a key that is no integer")) \
            if key_t is int else (lambda k: k)
        return lambda d, v, depth: {key(k): value(d, x, depth + 1) for k, x in v.items()} if type(v) is dict \
            else _bad(where, "expected an object")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        by_value = {m.value: m for m in hint}
        return lambda d, v, depth: by_value[v] if isinstance(v, str) and v in by_value else \
            _bad(where, f"{str(v)[:40]!r} is not a {hint.__name__}")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda d, v, depth: (d._build(hint, v, depth + 1) if type(v) is dict
                                    else _bad(where, "expected an object"))
    ok = _PRIMITIVE_OK.get(hint)
    if ok is None:
        raise TypeError(f"{where}: a recording cannot hold a {hint!r}")
    if hint is float:
        return lambda d, v, depth: (float(cast(float, v)) if ok(v)
                                    else _bad(where, f"expected a number, got {type(v).__name__}"))
    return lambda d, v, depth: v if ok(v) else _bad(where, f"expected {hint.__name__}, got {type(v).__name__}")
