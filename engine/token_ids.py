"""A request's generated token ids as each step's RequestOutput sees them, without copying them every step.

A RequestOutput carries every token generated so far (`token_ids`). Copying the request's list into a tuple
each step costs O(tokens so far) per request per step: ~13 us at 4,000 tokens, so 64 long answers would take
the whole host budget of a step (issue 46). Instead the output holds a TokenIds: the request's own list and
its length at that step. The engine only ever appends to that list (AppendOnlyIds refuses anything else), so
the first `n` entries never change and the view is immutable to its readers, on any thread, while the engine
keeps appending behind it.

A TokenIds reads as a tuple: indexing, slicing (a tuple), iteration, equality with tuples, lists and other
views (either side), a tuple's hash, a tuple's repr; it pickles and copies as a plain tuple. json.dumps does
not take it (json takes only real lists and tuples): write `list(out.token_ids)`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import NoReturn, SupportsIndex, overload


class AppendOnlyIds(list[int]):
    """A list that only grows: the storage behind every TokenIds of a request. Appending and extending are
    the list's own (no cost added on the hot path); anything that would change or drop an entry raises, so
    no output handed out earlier can change under its reader."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a request's generated tokens only grow: earlier outputs share them (engine/token_ids.py)")

    __setitem__ = __delitem__ = __imul__ = _refuse  # type: ignore[assignment]
    pop = remove = clear = insert = sort = reverse = _refuse  # type: ignore[assignment]


class TokenIds(Sequence[int]):
    """The first `n` ids of a list that only grows: a read-only, tuple-like snapshot made in O(1)."""

    __slots__ = ("_hash", "_ids", "_n")

    def __init__(self, ids: list[int], n: int | None = None) -> None:
        if n is not None and not 0 <= n <= len(ids):
            raise ValueError(f"a view of {n} tokens over a list of {len(ids)}")
        self._ids = ids
        self._n = len(ids) if n is None else n
        self._hash: int | None = None

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            ids = self._ids
            return tuple([ids[i] for i in range(*index.indices(self._n))])
        i = index.__index__()
        if not -self._n <= i < self._n:
            raise IndexError("token index out of range")
        return self._ids[i + self._n if i < 0 else i]

    def __iter__(self) -> Iterator[int]:
        return islice(self._ids, self._n)

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(self._ids[:self._n])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return other._n == self._n and (other._ids is self._ids or self._ids[:self._n] == other._ids[:other._n])
        if isinstance(other, tuple):
            return len(other) == self._n and self.as_tuple() == other
        if isinstance(other, list):
            return len(other) == self._n and self._ids[:self._n] == other
        return NotImplemented

    def __hash__(self) -> int:  # a tuple's: a view and the tuple it equals land in the same dict slot
        if self._hash is None:
            self._hash = hash(self.as_tuple())
        return self._hash

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __add__(self, other: object) -> tuple[int, ...]:  # with a tuple or a view, as a tuple adds
        if not isinstance(other, (tuple, TokenIds)):
            return NotImplemented
        return self.as_tuple() + tuple(other)

    def __radd__(self, other: object) -> tuple[int, ...]:
        if not isinstance(other, tuple):
            return NotImplemented
        return other + self.as_tuple()

    def __reduce__(self) -> tuple[type[tuple[int, ...]], tuple[tuple[int, ...]]]:
        return tuple, (self.as_tuple(),)  # pickled, copied and deep-copied as the plain tuple it stands for
