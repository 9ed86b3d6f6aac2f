"""libvirt connections (pooled per process) and libvirt errors as DriverErrors."""

import functools
import hashlib
import threading

import libvirt

from provisioning.drivers.base import Conflict, DriverError, Invalid, NotFound, Unreachable

# libvirt prints every error to stderr unless a handler is set; we raise them instead.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def _codes(*names):
    return {getattr(libvirt, name) for name in names if hasattr(libvirt, name)}


NOT_FOUND = _codes(
    "VIR_ERR_NO_DOMAIN", "VIR_ERR_NO_STORAGE_POOL", "VIR_ERR_NO_STORAGE_VOL", "VIR_ERR_NO_NETWORK",
    "VIR_ERR_NO_DOMAIN_SNAPSHOT",
)  # fmt: skip
CONFLICT = _codes("VIR_ERR_OPERATION_INVALID", "VIR_ERR_OPERATION_FAILED", "VIR_ERR_DOM_EXIST")
INVALID = _codes(
    "VIR_ERR_XML_ERROR", "VIR_ERR_XML_DETAIL", "VIR_ERR_INVALID_ARG", "VIR_ERR_CONFIG_UNSUPPORTED",
    "VIR_ERR_NO_SUPPORT", "VIR_ERR_INVALID_NETWORK", "VIR_ERR_INVALID_STORAGE_VOL",
)  # fmt: skip
AUTH = _codes("VIR_ERR_AUTH_FAILED", "VIR_ERR_AUTH_CANCELLED", "VIR_ERR_AUTH_UNAVAILABLE")
TRANSPORT = _codes("VIR_ERR_SYSTEM_ERROR", "VIR_ERR_RPC", "VIR_ERR_NO_CONNECT", "VIR_ERR_OPERATION_TIMEOUT")
BUSY = _codes("VIR_ERR_AGENT_UNRESPONSIVE", "VIR_ERR_OPERATION_ABORTED", "VIR_ERR_AGENT_UNSYNCED")
TRANSPORT_DOMAINS = _codes("VIR_FROM_RPC", "VIR_FROM_REMOTE")


def translate(exc, context):
    """A libvirtError as a DriverError that says whether a retry can help."""
    code, message = exc.get_error_code(), f"{context}: {exc.get_error_message() or exc}"
    if code in NOT_FOUND:
        return NotFound(message)
    if code in AUTH:
        return Unreachable(message, permanent=True)
    if code in TRANSPORT or exc.get_error_domain() in TRANSPORT_DOMAINS:
        return Unreachable(message)
    if code in BUSY:
        return DriverError(message, permanent=False)
    if code in CONFLICT:
        return Conflict(message)
    if code in INVALID:
        return Invalid(message)
    return DriverError(message, permanent=True)


def translated(method):
    """libvirt errors raised outside ``_call`` (a state read, say) still leave as DriverErrors."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except libvirt.libvirtError as exc:
            raise translate(exc, f"{method.__name__} on {self.uri}") from exc

    return wrapper


class _Connections:
    """One open connection per URI, credentials and process, reopened when it dies."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open = {}

    def get(self, uri, credentials):
        # The password is part of the key: a wrong one must never ride on a connection opened with the right one.
        secret = hashlib.sha256(str(credentials.get("password", "")).encode()).hexdigest()
        key = (uri, credentials.get("username"), secret)
        with self._lock:
            conn = self._open.get(key)
            if conn is not None:
                try:
                    if conn.isAlive():
                        return conn
                except libvirt.libvirtError:
                    pass
            try:
                conn = _open(uri, credentials)
            except libvirt.libvirtError as exc:
                raise translate(exc, f"cannot connect to {uri}") from exc
            self._open[key] = conn
            return conn

    def forget(self, uri=None):
        """Close pooled connections (all, or those to ``uri``); tests use it to start afresh."""
        with self._lock:
            for key in [key for key in self._open if uri is None or key[0] == uri]:
                try:
                    self._open.pop(key).close()
                except libvirt.libvirtError:
                    pass


def open_own(uri, credentials):
    """A connection of the caller's own, outside the pool (closed by the caller): for a console
    stream, whose blocking read holds its connection for as long as the guest says nothing, so
    the pool's calls (a VNC address, a state read) would wait behind it."""
    try:
        return _open(uri, credentials)
    except libvirt.libvirtError as exc:
        raise translate(exc, f"cannot connect to {uri}") from exc


def _open(uri, credentials):
    from provisioning.drivers import registry

    refused = registry.uri_errors("libvirt", uri)
    if refused:  # the last gate: a URI that reached the driver by any path is checked here too
        raise Invalid(f"{uri.split('?')[0]}: {refused}")
    if not credentials:
        return libvirt.open(uri)

    def answer(creds, _data):
        for cred in creds:
            if cred[0] == libvirt.VIR_CRED_AUTHNAME:
                cred[4] = credentials.get("username", "")
            elif cred[0] == libvirt.VIR_CRED_PASSPHRASE:
                cred[4] = credentials.get("password", "")
        return 0

    auth = [[libvirt.VIR_CRED_AUTHNAME, libvirt.VIR_CRED_PASSPHRASE], answer, None]
    return libvirt.openAuth(uri, auth, 0)


connections = _Connections()
