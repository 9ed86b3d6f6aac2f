"""What a driver call raises: one family of errors, each saying whether a retry may help.

Apart from ``drivers/base.py`` so that the registry, which names the kinds of driver, can raise
them without importing the driver contract (which asks the registry what its kind runs).
"""


class DriverError(Exception):
    """A driver call failed. ``permanent``: retrying the same call cannot succeed."""

    permanent = True

    def __init__(self, message, *, permanent=None):
        super().__init__(message)
        if permanent is not None:
            self.permanent = permanent

    def __reduce__(self):  # picklable with its flag, so it survives being sent between processes
        return (_rebuild_error, (type(self), str(self), self.permanent))


def _rebuild_error(cls, message, permanent):
    return cls(message, permanent=permanent)


class Invalid(DriverError):
    """The request itself is wrong (bad spec, wrong image format, checksum mismatch)."""


class NotFound(DriverError):
    """The VM, snapshot, image, network or host does not exist."""


class Conflict(DriverError):
    """The object is in a state that forbids the call, or the name belongs to another VM."""


class Unreachable(DriverError):
    """The hypervisor cannot be reached or did not answer (temporary unless credentials are bad)."""

    permanent = False


class Unauthorized(DriverError):
    """The host's credential may not be used for it (not saved for its URI): a permanent refusal."""


class NoConsole(DriverError):
    """The VM has no console vclmgr can reach (a simulated VM, a driver without one, a
    console that listens where vclmgr cannot connect)."""
