"""Errors that services raise and every interface understands the same way.

``Conflict``: the object is not in a state that allows this (cancel a finished job, end an
ended reservation). ``InUse``, a kind of Conflict: it cannot be deleted while something holds
it; the message says what. ``Upstream``, also a Conflict: a system outside vclmgr (a BMC) refused
or did not answer; the API answers it with 502. The API answers the others with 409 (``core.api.errors``); pages and
commands show the message.
"""


class Conflict(Exception):
    """The object is not in a state that allows this; the message says why."""


class InUse(Conflict):
    """The object cannot be deleted now; the message says what holds it."""


class Upstream(Conflict):
    """A system vclmgr drives (a host's BMC) refused or did not answer; nothing was changed."""
