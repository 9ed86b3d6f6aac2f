"""Plain records for the htools ports: ``__slots__`` classes with a dataclass's equality,
repr and `replace`, without `dataclasses`.

Why: ``htools hspace --simulate …`` on a small cluster must finish before Ganeti's
compiled hspace does (about 0.04 s), and importing `dataclasses` (it pulls in `inspect`,
`ast`, `dis`, `tokenize`, …) plus generating every class's methods at import time cost
more than half of that. Each record lists its fields in ``__slots__`` and writes its own
``__init__``; `Record` adds what a dataclass would (fields compared in order, the same
repr), `Frozen` also hashing and refusing assignment, as ``frozen=True`` does.
"""

from __future__ import annotations


class Record:
    __slots__ = ()

    def _fields(self) -> tuple:
        return tuple([getattr(self, name) for name in self.__slots__])

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable, like a dataclass with eq and without frozen

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({inner})"

    def __getstate__(self):
        return self._fields()

    def __setstate__(self, state) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            object.__setattr__(self, name, value)


class Frozen(Record):
    __slots__ = ()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r}")


def replace(record, **changes):
    """`dataclasses.replace` for records: a copy with ``changes``."""
    new = object.__new__(record.__class__)
    for name in record.__slots__:
        object.__setattr__(new, name, changes.pop(name) if name in changes else getattr(record, name))
    if changes:
        raise TypeError(f"{record.__class__.__name__} has no field {next(iter(changes))!r}")
    return new
