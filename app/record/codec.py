"""Channel items <-> JSON: every item an engine source publishes (app/source/channel.py, the engine's
EngineStepEvent / MemorySnapshot / BlockMapSnapshot, EngineInfo) as one JSON object.

Only the classes in REGISTRY are ever built from a file (a recording names a class, never a module), and
each field is rebuilt by its type hint: enums from their values, tuples from lists, integer keys from JSON's
string keys, and a value of the wrong kind refused (BadItem), so a lying file cannot hand a panel a string
where it adds numbers.

A step's RequestOutputs are written as deltas: `token_ids` and `text` (everything so far, growing with each
token: quadratic over a request) are left out and rebuilt by the Decoder from the new tokens and text.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections import OrderedDict
from collections.abc import Mapping

from app.remote import facts as remote_facts
from app.source import channel
from app.source.engine_info import Capabilities, EngineInfo
from engine import events

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


_HINTS: dict[type, dict[str, object]] = {}


def _hints(cls: type) -> dict[str, object]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


class Decoder:
    """Builds items from decoded JSON; keeps each live request's running token ids and text."""

    def __init__(self) -> None:
        self._streams: OrderedDict[str, tuple[tuple[int, ...], str]] = OrderedDict()

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
        hints = _hints(cls)
        kwargs = {}
        for name, value in data.items():
            if name == "_t":
                continue
            if name not in hints:
                raise BadItem(f"{cls.__name__} has no field {name[:40]!r}")
            kwargs[name] = self._as(hints[name], value, depth + 1, f"{cls.__name__}.{name}")
        if cls is events.RequestOutput:
            kwargs.update(self._totals(kwargs))
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field missing
            raise BadItem(f"{cls.__name__}: {exc}") from None

    def _totals(self, kw: dict) -> dict:
        rid = kw.get("request_id", "")
        ids, text = self._streams.pop(rid, ((), ""))
        ids, text = ids + tuple(kw.get("new_token_ids", ())), text + kw.get("new_text", "")
        if not kw.get("finished"):
            self._streams[rid] = (ids, text)
            if len(self._streams) > MAX_STREAMS:
                self._streams.popitem(last=False)
        return {"token_ids": ids, "text": text}

    def _as(self, hint, value, depth: int, where: str):  # noqa: C901 (one branch per kind of hint)
        if depth > MAX_DEPTH:
            raise BadItem("nested too deep")
        if hint in (object, typing.Any):
            return self._generic(value, depth, where)
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            if value is None and type(None) in typing.get_args(hint):
                return None
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            for arg in args[:-1]:
                try:
                    return self._as(arg, value, depth, where)
                except BadItem:
                    continue
            return self._as(args[-1], value, depth, where)
        if origin in (tuple, frozenset):
            if not isinstance(value, list):
                raise BadItem(f"{where}: expected a list")
            args = typing.get_args(hint)
            if origin is frozenset:
                return frozenset(self._as(args[0], v, depth + 1, where) for v in value)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self._as(args[0], v, depth + 1, where) for v in value)
            if len(args) != len(value):
                raise BadItem(f"{where}: expected {len(args)} values")
            return tuple(self._as(a, v, depth + 1, where) for a, v in zip(args, value))
        if origin in (dict, Mapping) or hint is dict:
            if not isinstance(value, dict):
                raise BadItem(f"{where}: expected an object")
            key_t, val_t = typing.get_args(hint) or (str, object)
            return {self._key(key_t, k, where): self._as(val_t, v, depth + 1, where) for k, v in value.items()}
        if isinstance(hint, type):
            return self._scalar(hint, value, depth, where)
        raise BadItem(f"{where}: cannot read a {hint!r}")

    def _scalar(self, hint: type, value, depth: int, where: str):
        if issubclass(hint, enum.Enum):
            try:
                return hint(value)
            except ValueError:
                raise BadItem(f"{where}: {str(value)[:40]!r} is not a {hint.__name__}") from None
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise BadItem(f"{where}: expected an object")
            return self._build(hint, value, depth + 1)
        ok = {bool: lambda v: isinstance(v, bool),
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}.get(hint)
        if ok is None or not ok(value):
            raise BadItem(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
        return float(value) if hint is float else value

    def _key(self, key_t, key: str, where: str):
        if key_t is int:
            try:
                return int(key)
            except ValueError:
                raise BadItem(f"{where}: key {key[:20]!r} is not an integer") from None
        return key

    def _generic(self, value, depth: int, where: str):
        """A field typed `object` (a ServerSample's facts, a ClientOutput's output): a registered class by
        its `_t`, else plain JSON with lists as tuples."""
        if isinstance(value, dict):
            name = value.get("_t")
            if name is not None:
                cls = REGISTRY.get(name) if isinstance(name, str) else None
                if cls is None:
                    raise BadItem(f"{where}: unknown class {str(name)[:40]!r}")
                return self._build(cls, value, depth + 1)
            return {k: self._generic(v, depth + 1, where) for k, v in value.items()}
        if isinstance(value, list):
            return tuple(self._generic(v, depth + 1, where) for v in value)
        return value
