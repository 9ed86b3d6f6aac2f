"""The one way a lower layer is extended by a higher one: a ``Hook``.

A layer imports only the layers below it (``tests/test_layers.py``), yet some of its work needs an
answer only a layer above has: why a host is still in use, who may watch a topic, what follows
an event. So the module that needs the answer declares a hook, typed by what it holds, and the
app that has the answer fills it in its ``AppConfig.ready()``::

    IN_USE_CHECKERS: Hook[Callable[[Hypervisor], str | None]] = Hook("inventory.services.IN_USE_CHECKERS")
    services.IN_USE_CHECKERS.register(in_use_reason)  # provisioning's ready(), a layer above

Three shapes: a list (``register(fn)``, iterate the hook), a table (``keyed=True``:
``register(key, fn)``, ``for_key(key)``) and a slot (``single=True``: ``one()``; keyed and single,
one per key: ``one(key)``). Registering is idempotent, as ``ready()`` may run more than once; a slot
refuses a second, different callable (ValueError): two apps filling one slot is a wiring mistake,
not an override. Tests swap registrations with ``replaced(...)``.

Django's and libraries' signals (``post_migrate``, ``connection_created``, django-q's
``post_spawn``, axes' ``user_locked_out``, django-auth-ldap's ``ldap_error``) stay signals: they
are the frameworks' hooks into the project. A ``Hook`` is the project's own, between its layers.
"""

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

HOOKS: list["Hook[Any]"] = []  # every hook declared (a test checks that start-up fills them)


class Hook(Generic[T]):
    def __init__(self, name: str, *, keyed: bool = False, single: bool = False):
        self.name, self.keyed, self.single = name, keyed, single
        # key (None unless keyed) -> what is registered, in order. Read it, never write it: the
        # event outbox's hot path looks listeners up in it directly.
        self.by_key: dict[Hashable, tuple[T, ...]] = {}
        HOOKS.append(self)

    @overload
    def register(self, fn: T, /) -> None: ...
    @overload
    def register(self, key: Hashable, fn: T, /) -> None: ...
    def register(self, *args):
        key, fn = args if self.keyed else (None, *args)
        held = self.by_key.get(key, ())
        if fn in held:
            return
        if self.single and held:
            raise ValueError(f"{self.name}{f'[{key!r}]' if self.keyed else ''} holds {held[0]!r} already")
        self.by_key[key] = (*held, fn)

    def for_key(self, key: Hashable) -> tuple[T, ...]:
        return self.by_key.get(key, ())

    def one(self, key: Hashable = None) -> T | None:
        """A slot's callable (``single=True``), or None while nobody has registered one."""
        held = self.by_key.get(key, ())
        return held[0] if held else None

    def items(self) -> Iterator[tuple[Hashable, T]]:
        return ((key, fn) for key, held in self.by_key.items() for fn in held)

    def __iter__(self) -> Iterator[T]:
        return (fn for held in self.by_key.values() for fn in held)

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def __repr__(self) -> str:
        return f"<Hook {self.name}>"

    @contextmanager
    def replaced(self, *registrations):
        """Tests: only these registrations inside the block (``(key, fn)`` pairs when keyed)."""
        saved = dict(self.by_key)
        self.by_key.clear()  # in place: whoever holds ``by_key`` sees the swap
        try:
            for registration in registrations:
                self.register(*(registration if self.keyed else (registration,)))
            yield self
        finally:
            self.by_key.clear()
            self.by_key.update(saved)
