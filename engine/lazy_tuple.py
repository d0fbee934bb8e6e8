"""`LazyTuple`: a tuple's worth of values built the first time anything reads them.

A token's sampler-stage snapshots cost a few hundred µs to build and most are never looked at while the
answer streams (the stage view opens on one token; the store and the served record read them after the
answer or off the model's thread). The decode loop keeps what is needed to build them exactly and hands out
a `LazyTuple`; whoever reads it first builds it, once, on their own thread.

It reads like the tuple it stands for (index, slice, len, iteration, truth, `==` and hash with tuples), and
pickles as that tuple.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class LazyTuple(Sequence[T], Generic[T]):
    """The tuple `build()` returns, built on first read and kept; `build` is dropped once it has run.

    `build` must depend only on what it captured (never on state that changes after it was made), so it
    gives the same tuple whenever and on whichever thread it runs. Two threads reading at once may both build
    it; either result is the same, and one is kept.
    """

    __slots__ = ("_build", "_value")

    def __init__(self, build: Callable[[], tuple[T, ...]]) -> None:
        self._build: Callable[[], tuple[T, ...]] | None = build
        self._value: tuple[T, ...] | None = None

    @property
    def built(self) -> bool:
        """Whether the values exist yet (reading them builds them)."""
        return self._value is not None

    def get(self) -> tuple[T, ...]:
        """The tuple, built now if no one has read it yet."""
        value = self._value
        if value is None:
            build = self._build
            if build is None:  # another thread built it between the two reads
                value = self._value
                assert value is not None
                return value
            value = tuple(build())
            self._value = value  # set before the builder is dropped: a reader that finds no builder finds this
            self._build = None
        return value

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        return self.get()[index]

    def __len__(self) -> int:
        return len(self.get())

    def __iter__(self) -> Iterator[T]:
        return iter(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTuple):
            return self.get() == other.get()
        if isinstance(other, tuple):
            return self.get() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.get())

    def __repr__(self) -> str:
        return f"LazyTuple({self.get()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self.get(),))


def as_tuple(values: Sequence[T] | None) -> tuple[T, ...] | None:
    """`values` as a plain tuple (a `LazyTuple` built), None as None."""
    if values is None or isinstance(values, tuple):
        return values
    return values.get() if isinstance(values, LazyTuple) else tuple(values)
