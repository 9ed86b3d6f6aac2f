"""libvirt connections (pooled per process) and libvirt errors as DriverErrors.

Every open has a deadline and every call on an open connection a keepalive:

- libvirt has no connect timeout, and its keepalive starts only once an open has returned: an
  open to a peer that accepts and then says nothing waits for ever. So each open runs in a
  daemon thread, and the caller waits ``VCLMGR_LIBVIRT_OPEN_TIMEOUT`` seconds for it, then
  gives up with a retryable ``Unreachable``. A given-up open keeps its thread until the peer
  answers or hangs up (a connection that arrives after all is closed at once), so such threads
  are bounded: at most ``MAX_OPENING`` opens are under way in a process, and a peer that already
  holds a given-up open is refused at once instead of being handed another thread.
- An open connection gets libvirt's keepalive (``virConnectSetKeepAlive``, driven by libvirt's
  default event loop in one daemon thread per process): a peer that stops answering, in the
  middle of a call or between calls, is dropped after ``VCLMGR_LIBVIRT_CALL_TIMEOUT`` seconds,
  and the call waiting on it fails. A slow call to a peer that still answers keepalive probes
  (a long migration, say) is not cut short.
"""

import functools
import hashlib
import math
import os
import threading
import urllib.parse

import libvirt
from django.conf import settings

from drivers.base import Conflict, DriverError, Invalid, NotFound, Unreachable

# libvirt prints every error to stderr unless a handler is set; we raise them instead.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def _codes(*names):
    return {getattr(libvirt, name) for name in names if hasattr(libvirt, name)}


NOT_FOUND = _codes(
    "VIR_ERR_NO_DOMAIN", "VIR_ERR_NO_STORAGE_POOL", "VIR_ERR_NO_STORAGE_VOL", "VIR_ERR_NO_NETWORK",
    "VIR_ERR_NO_DOMAIN_SNAPSHOT", "VIR_ERR_NO_NODE_DEVICE",
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
        self._opening = {}  # key → its lock: an open to one host never waits behind another host's

    def get(self, uri, credentials):
        # The password is part of the key: a wrong one must never ride on a connection opened with the right one.
        secret = hashlib.sha256(str((credentials or {}).get("password", "")).encode()).hexdigest()
        key = (uri, (credentials or {}).get("username"), secret)
        with self._lock:
            key_lock = self._opening.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                conn = self._open.get(key)
            if conn is not None:
                try:
                    if conn.isAlive():
                        return conn
                except libvirt.libvirtError:
                    pass
            conn = open_own(uri, credentials)
            with self._lock:
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
    from drivers import registry

    refused = registry.uri_errors("libvirt", uri)
    if refused:  # the last gate: a URI that reached the driver by any path is checked here too
        raise Invalid(f"{uri.split('?')[0]}: {refused}")
    _event_loop.start()  # before the open: libvirt gives a connection keepalive only if a loop was there
    try:
        conn = _opening.open(uri, credentials)
        _keep_alive(conn)
    except libvirt.libvirtError as exc:
        raise translate(exc, f"cannot connect to {uri}") from exc
    return conn


def _keep_alive(conn):
    """Probe the peer every ``interval`` s; drop it after ``count`` unanswered probes in a row,
    so that VCLMGR_LIBVIRT_CALL_TIMEOUT s pass between its last word and the drop."""
    timeout = settings.VCLMGR_LIBVIRT_CALL_TIMEOUT
    interval = max(1, math.ceil(timeout / 6))
    count = max(1, round(timeout / interval) - 1)
    try:
        conn.setKeepAlive(interval, count)
    except libvirt.libvirtError as exc:
        # Drivers without a daemon (test:///) have no keepalive, and need none.
        if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
            conn.close()
            raise


class _EventLoop:
    """libvirt's default event loop, run by one daemon thread per process: it sends the keepalive
    probes and notices the missing answers while no call is under way."""

    def __init__(self):
        self._lock = threading.Lock()
        self._registered = False
        self._pid = None

    def start(self):
        with self._lock:
            if self._pid == os.getpid():
                return
            if not self._registered:  # once per process image: a forked child inherits it
                libvirt.virEventRegisterDefaultImpl()
                self._registered = True
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="libvirt-events", daemon=True).start()

    @staticmethod
    def _run():
        while True:
            if libvirt.virEventRunDefaultImpl() < 0:
                return


_event_loop = _EventLoop()


MAX_OPENING = 8
"""Opens under way at once in a process, given-up ones included: the most threads that peers
which accept and never answer can hold there (one each)."""


class _Opening:
    """Opens in daemon threads under a deadline; see the module's docstring."""

    def __init__(self):
        self._lock = threading.Lock()
        self._under_way = 0
        self._given_up = {}  # peer → opens given up on and still running

    def open(self, uri, credentials):
        timeout = settings.VCLMGR_LIBVIRT_OPEN_TIMEOUT
        peer = _peer(uri)
        with self._lock:
            if self._given_up.get(peer):
                raise Unreachable(f"cannot connect to {uri}: an earlier connection to it has not answered yet")
            if self._under_way >= MAX_OPENING:
                raise Unreachable(f"cannot connect to {uri}: {MAX_OPENING} libvirt connections are still opening")
            self._under_way += 1
        attempt = {"given_up": False, "done": False, "finished": threading.Event()}
        threading.Thread(
            target=self._run, args=(attempt, uri, credentials, peer), name="libvirt-open", daemon=True
        ).start()
        attempt["finished"].wait(timeout)
        with self._lock:
            if not attempt["done"]:
                attempt["given_up"] = True
                self._given_up[peer] = self._given_up.get(peer, 0) + 1
                raise Unreachable(f"cannot connect to {uri}: no answer within {timeout:g} s")
        if "error" in attempt:
            raise attempt["error"]
        return attempt["conn"]

    def _run(self, attempt, uri, credentials, peer):
        try:
            attempt["conn"] = _connect(uri, credentials)
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
            attempt["error"] = exc
        with self._lock:
            attempt["done"] = True
            self._under_way -= 1
            if attempt["given_up"]:
                self._given_up[peer] -= 1
                if not self._given_up[peer]:
                    del self._given_up[peer]
        attempt["finished"].set()
        if attempt["given_up"] and attempt.get("conn") is not None:
            try:  # nobody waits for it any more
                attempt["conn"].close()
            except libvirt.libvirtError:
                pass

    def under_way(self):
        with self._lock:
            return self._under_way


def _peer(uri):
    """What a silent peer is known by: the URI's host and port (the whole URI for a local one)."""
    parts = urllib.parse.urlsplit(uri)
    return f"{parts.hostname}:{parts.port}" if parts.hostname else uri


_opening = _Opening()


def _connect(uri, credentials):
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
