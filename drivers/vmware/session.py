"""vSphere sessions (pooled per process) and pyVmomi faults as DriverErrors."""

import contextlib
import functools
import hashlib
import http.client
import ssl
import threading
import time

from pyVim.connect import Disconnect
from pyVmomi import vim, vmodl

from drivers.base import Conflict, DriverError, Invalid, NotFound, Unreachable


def _faults(*names):
    found = []
    for name in names:
        module, _, attr = name.rpartition(".")
        cls = getattr({"vim": vim.fault, "vmodl": vmodl.fault}[module], attr, None)
        if cls is not None:
            found.append(cls)
    return tuple(found)


NOT_FOUND = _faults("vmodl.ManagedObjectNotFound", "vim.NotFound", "vim.FileNotFound")
CONFLICT = _faults(
    "vim.InvalidPowerState", "vim.InvalidState", "vim.DuplicateName", "vim.AlreadyExists", "vim.FileAlreadyExists",
    "vim.InsufficientResourcesFault", "vim.InvalidDatastore",
)  # fmt: skip
TEMPORARY = _faults("vim.TaskInProgress", "vim.Timedout", "vmodl.HostCommunication", "vim.HostConnectFault")
INVALID = _faults(
    "vmodl.InvalidArgument", "vmodl.NotSupported", "vmodl.InvalidRequest", "vmodl.NotImplemented",
    "vim.InvalidVmConfig", "vim.InvalidName",
)  # fmt: skip


def translate(exc, context):
    """A pyVmomi fault or a transport error as a DriverError that says whether a retry can help."""
    text = str(exc).strip()
    detail = getattr(exc, "msg", None) or (text.splitlines()[0] if text else "")
    message = f"{context}: {type(exc).__name__.rpartition('.')[2]}{': ' + detail if detail else ''}"
    if isinstance(exc, vim.fault.InvalidLogin):
        return Unreachable(message, permanent=True)
    if isinstance(exc, vim.fault.NotAuthenticated):
        return Unreachable(message)
    if isinstance(exc, NOT_FOUND):
        return NotFound(message)
    if isinstance(exc, TEMPORARY):
        return DriverError(message, permanent=False)
    if isinstance(exc, CONFLICT):
        return Conflict(message)
    if isinstance(exc, INVALID):
        return Invalid(message)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Unreachable(f"{message} (set the insecure option to skip the check)", permanent=True)
    if isinstance(exc, (OSError, http.client.HTTPException)):
        return Unreachable(message)
    return DriverError(message, permanent=True)


def translated(method):
    """Faults raised outside ``_call`` (a property read, say) still leave as DriverErrors."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except DriverError:
            raise
        except (vmodl.MethodFault, OSError, http.client.HTTPException) as exc:
            if isinstance(exc, vim.fault.NotAuthenticated):
                sessions.forget(self)
            raise translate(exc, f"{method.__name__} at {self.endpoint[1]}") from exc

    return wrapper


class _Sessions:
    """One logged-in session per endpoint, credentials and process, checked after idling."""

    IDLE_CHECK_SECONDS = 300

    def __init__(self):
        self._lock = threading.Lock()
        self._open = {}

    @staticmethod
    def _key(driver):
        # The password is part of the key: a wrong one must never ride on a session opened with the right one.
        return driver.endpoint, driver.username, hashlib.sha256(driver.password.encode()).hexdigest()

    def get(self, driver):
        key = self._key(driver)
        with self._lock:
            si, checked = self._open.get(key, (None, 0))
            if si is not None and time.monotonic() - checked > self.IDLE_CHECK_SECONDS:
                try:
                    alive = si.content.sessionManager.currentSession is not None
                except Exception:  # noqa: BLE001 (any failure means: log in again)
                    alive = False
                si = si if alive else None
            if si is None:
                si = driver.connect()
            self._open[key] = (si, time.monotonic())
            return si

    def forget(self, driver):
        with self._lock:
            si, _ = self._open.pop(self._key(driver), (None, 0))
        if si is not None:
            with contextlib.suppress(Exception):
                Disconnect(si)


sessions = _Sessions()
