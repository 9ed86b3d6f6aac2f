"""The one policy for what vclmgr connects to on a user's or operator's say-so: webhooks, BMCs
(Redfish), the hypervisor URIs discovery opens.

Contract:

- ``check(url)`` parses the URL and refuses, before any connection, a host that is internal by
  its form (one label, ``localhost``, ``.local``, ``.internal``…, an IP written in decimal, octal
  or hex), then resolves the name once and refuses unless every address it resolves to is public
  — not loopback, link-local (the cloud metadata address), private, shared, multicast, reserved
  or unspecified; an IPv4 address inside IPv6 (mapped, 6to4, NAT64) counts as that IPv4 address.
  ``VCLMGR_OUTBOUND_ALLOW`` names networks and host names allowed besides. It returns the
  ``Target``: scheme, host, port and the one address to connect to. ``check_host`` does the same
  for a bare host name (a libvirt or vCenter URI's host).
- ``session(target, …)`` is a ``requests`` session that connects to that checked address only
  (the Host header and the TLS name stay the URL's: no second lookup a DNS answer could rebind),
  refuses a request to any other scheme, host or port (a redirect, or a link a server hands
  back), ignores the environment's proxies, and bounds each request by a connect timeout and a
  deadline for the whole request (a server trickling bytes is cut off when it is up).
- ``post(url, …)`` is one such request with no redirect followed: a 3xx is the answer.
- ``download(url, out, …)`` is a GET streamed into a file (an image): each redirect's target
  checked as the first URL was, the whole transfer under one deadline and a size limit.
- A refusal raises ``Refused``, anything else that fails ``Failed``; both are ``OutboundError``,
  whose ``str`` is the detail for the server's log. What an untrusted viewer may read is
  ``PUBLIC_ERROR`` and nothing else, so a delivery log cannot tell a refused address from a
  closed port, a silent one or an error status (no port-scan oracle).
"""

import concurrent.futures
import contextlib
import ipaddress
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

PUBLIC_ERROR = "delivery failed"
DEFAULT_PORTS = {"http": 80, "https": 443}
# Special-use and commonly internal names (RFC 6761, 6762, 8375 and usage): never on the internet.
INTERNAL_SUFFIXES = ("localhost", "local", "internal", "intranet", "lan", "localdomain", "home.arpa", "corp",
                     "home", "private", "invalid", "test", "onion")  # fmt: skip
# Something made of numbers (decimal, octal 0177, hex 0x7f) and dots: an IP address however written.
NUMERIC_HOST = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+))*\.?", re.IGNORECASE)
NAT64 = ipaddress.ip_network("64:ff9b::/96")
RESOLVE_SECONDS = 5.0
_resolver = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="outbound-resolve")


class OutboundError(Exception):
    """A request that was not made or did not succeed; ``str``: the detail, for the server's log."""

    public = PUBLIC_ERROR


class Refused(OutboundError):
    """The policy refused the target before any connection."""


class Failed(OutboundError):
    """The target was allowed, but the request failed (unresolvable, refused, timed out, TLS…).
    ``status``: the HTTP status of an answer that was an error, else None."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class TooLarge(Failed):
    """A download was larger than its limit (retrying cannot help)."""


class _RefusedByAdapter(Refused, requests.exceptions.InvalidURL):
    """Raised inside a session, where callers (sushy) catch requests' exceptions."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as in the URL, lower case, without IPv6 brackets
    port: int | None
    address: str  # the checked address connections go to

    @property
    def origin(self):
        return origin_of(self.scheme, self.host.rstrip("."), self.port)


def origin_of(scheme, host, port):
    """``scheme://host:port`` with the scheme's default port filled in (the unit a credential is bound to)."""
    port = port or DEFAULT_PORTS.get(scheme)
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" + (f":{port}" if port else "")


def origin(url):
    """The origin of ``url`` (``ValueError`` if it has no host or a bad port)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{url[:100]!r} names no host")
    return origin_of(parts.scheme.lower(), parts.hostname.rstrip("."), parts.port)


# --- the address policy --------------------------------------------------------------------


def _allow_list():
    networks, names = [], set()
    for entry in settings.VCLMGR_OUTBOUND_ALLOW:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.add(entry.lower().rstrip("."))
    return networks, names


def _as_ipv4(ip):
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64), else the address itself."""
    if ip.version == 6:
        if ip.ipv4_mapped:
            return ip.ipv4_mapped
        if ip.sixtofour:
            return ip.sixtofour
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def is_public(ip):
    ip = _as_ipv4(ipaddress.ip_address(ip))
    special = ip.is_loopback or ip.is_link_local or ip.is_private or ip.is_multicast or ip.is_reserved
    return ip.is_global and not special and not ip.is_unspecified


def _name_refusal(host):
    """Why a host name is refused by its form alone, or None."""
    try:
        ipaddress.ip_address(host)
        return None  # a literal address: the address check decides
    except ValueError:
        pass
    if NUMERIC_HOST.fullmatch(host):
        return f"{host!r} is an IP address in a non-standard form"
    if "." not in host.rstrip("."):
        return f"{host!r} is a name inside a local network"
    if host.rstrip(".").endswith(tuple(f".{suffix}" for suffix in INTERNAL_SUFFIXES)) or host in INTERNAL_SUFFIXES:
        return f"{host!r} is a name inside a local network"
    return None


def _resolve(host, port, timeout):
    # getaddrinfo takes no timeout: it runs in a thread the caller stops waiting for.
    future = _resolver.submit(socket.getaddrinfo, host, port or 0, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise Failed(f"resolving {host!r} timed out after {timeout:g} s") from None
    except (OSError, UnicodeError) as exc:
        raise Failed(f"cannot resolve {host!r}: {exc}") from None
    addresses = list(dict.fromkeys(info[4][0].split("%", 1)[0] for info in infos))
    if not addresses:
        raise Failed(f"{host!r} resolves to no address")
    return addresses


def _allowed(ip, networks):
    return any(each in net for each in {ip, _as_ipv4(ip)} for net in networks if net.version == each.version)


def check_host(host, port=None, timeout=RESOLVE_SECONDS):
    """The one address to connect to for ``host`` (a name or an IP), or ``Refused``/``Failed``;
    the lookup takes at most ``timeout`` seconds."""
    host = (host or "").strip().lower().strip("[]")
    if not host:
        raise Refused("no host")
    networks, names = _allow_list()
    if host.rstrip(".") in names:
        return _resolve(host, port, timeout)[0]
    refused = _name_refusal(host)
    if refused:
        raise Refused(refused)
    for address in (addresses := _resolve(host, port, timeout)):
        ip = ipaddress.ip_address(address)
        if not is_public(ip) and not _allowed(ip, networks):
            said = address if address == host else f"{host!r} resolves to {address}, which"
            raise Refused(f"{said} is not a public address")
    return addresses[0]


def check(url, schemes=("http", "https"), timeout=RESOLVE_SECONDS):
    """The ``Target`` of ``url``, checked (see the module doc); the lookup within ``timeout`` s."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"cannot parse the URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise Refused(f"scheme {scheme!r} is not one of {', '.join(schemes)}")
    if not parts.hostname:
        raise Refused("the URL names no host")
    host = parts.hostname.lower()
    return Target(scheme, host, port, check_host(host, port or DEFAULT_PORTS.get(scheme), timeout))


def refusal(url):
    """Why ``url`` would be refused without resolving it (for a form: a name is checked when used)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError as exc:
        return f"cannot parse the URL: {exc}"
    networks, names = _allow_list()
    if not host or host.rstrip(".") in names:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return _name_refusal(host)
    if is_public(ip) or _allowed(ip, networks):
        return None
    return f"{host} is not a public address"


# --- pinned connections with a deadline ----------------------------------------------------


class _Deadline:
    """The time limit of one whole request. A socket timeout bounds each read, not the answer: a
    server sending a byte a second would hold the caller for ever. When the time is up the timer
    shuts the connection's socket down, which ends any read or handshake blocked on it."""

    _current = threading.local()

    def __init__(self, seconds):
        self.seconds, self.sock, self.expired = seconds, None, False
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def __enter__(self):
        _Deadline._current.value = self
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        _Deadline._current.value = None

    def _expire(self):
        self.expired = True
        self._shut(self.sock)

    def watch(self, sock):
        """The request's socket, once connected (set before ``expired`` is read: no race is lost)."""
        self.sock = sock
        if self.expired:
            self._shut(sock)

    @staticmethod
    def _shut(sock):
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @classmethod
    def watch_current(cls, sock):
        deadline = getattr(cls._current, "value", None)
        if deadline is not None:
            deadline.watch(sock)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self):
        sock = super()._new_conn()
        _Deadline.watch_current(sock)
        return sock


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self):
        sock = super()._new_conn()
        _Deadline.watch_current(sock)
        return sock


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _PinnedAdapter(HTTPAdapter):
    """Sends to the target's checked address only; each request within ``total`` seconds."""

    def __init__(self, target, connect, total):
        self.target, self.connect, self.total = target, connect, total
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None):
        host_params, pool_kwargs = self.build_connection_pool_key_attributes(request, verify, cert)
        host_params["host"] = self.target.address
        if self.target.scheme == "https":
            pool_kwargs["server_hostname"] = self.target.host  # SNI and the certificate's name
        return self.poolmanager.connection_from_host(**host_params, pool_kwargs=pool_kwargs)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        parts = urllib.parse.urlsplit(request.url)
        if origin_of(parts.scheme.lower(), (parts.hostname or "").rstrip("."), parts.port) != self.target.origin:
            raise _RefusedByAdapter(f"{origin(request.url)} is not {self.target.origin}: refused")
        request.headers["Host"] = parts.netloc.rpartition("@")[2]
        if stream and getattr(_Deadline._current, "value", None) is not None:
            # ``download``: the body is read after this returns, under the caller's deadline.
            return super().send(
                request,
                stream=True,
                timeout=(min(self.connect, self.total), self.total),
                verify=verify,
                cert=cert,
                proxies={},
            )
        with _Deadline(self.total) as deadline:
            try:
                response = super().send(
                    request,
                    stream=False,
                    timeout=(min(self.connect, self.total), self.total),
                    verify=verify,
                    cert=cert,
                    proxies={},
                )
            except requests.RequestException:
                if deadline.expired:
                    raise requests.exceptions.Timeout(f"timed out after {self.total:g} s", request=request) from None
                raise
        if deadline.expired:  # the body was cut short
            raise requests.exceptions.Timeout(f"timed out after {self.total:g} s", request=request)
        return response


def pin(existing, target, *, connect, total):
    """Bind an existing ``requests`` session (a client library's) to ``target``: every request it
    sends goes through the pinned adapter, whatever its URL (proxies are not used)."""
    adapter = _PinnedAdapter(target, connect, total)
    existing.mount("http://", adapter)
    existing.mount("https://", adapter)
    return existing


def session(target, *, connect, total):
    """A ``requests`` session bound to ``target`` (see the module doc)."""
    pinned = requests.Session()
    pinned.trust_env = False  # a proxy would resolve the name itself: the checked address would not be the one used
    pinned.max_redirects = 5
    return pin(pinned, target, connect=connect, total=total)


def post(url, body, headers, *, timeout, connect=None):
    """POST ``body`` to ``url`` under the policy; the status code (no redirect is followed).
    ``timeout``: the whole request; ``connect``: the connection alone (default: the same)."""
    began = time.monotonic()
    target = check(url, timeout=timeout)
    left = max(0.05, timeout - (time.monotonic() - began))  # the lookup counts against the whole time
    with session(target, connect=min(connect or left, left), total=left) as pinned:
        try:
            response = pinned.post(url, data=body, headers=headers, allow_redirects=False)
        except requests.exceptions.Timeout as exc:
            raise Failed(f"{target.origin}: timed out after {timeout:g} s") from exc
        except requests.RequestException as exc:
            raise Failed(f"{target.origin}: {exc}") from exc
        return response.status_code


def download(url, out, *, timeout, max_bytes, connect=10.0, redirects=5):
    """GET ``url`` under the policy, writing the body to the binary file ``out``. A redirect's
    target is checked as the first URL was, before any connection to it (at most ``redirects``);
    the whole transfer, redirects included, takes at most ``timeout`` seconds and ``max_bytes``
    bytes. ``Failed`` (with ``status`` for an error answer) or ``Refused`` otherwise."""
    began = time.monotonic()
    with _Deadline(timeout) as deadline:
        for _ in range(redirects + 1):
            left = max(0.05, timeout - (time.monotonic() - began))
            target = check(url, timeout=min(RESOLVE_SECONDS, left))
            try:
                url = _get_into(url, target, out, max_bytes, connect=min(connect, left), total=left)
            except requests.RequestException as exc:
                if deadline.expired:
                    raise Failed(f"{target.origin}: timed out after {timeout:g} s") from exc
                raise Failed(f"{target.origin}: {exc}") from exc
            if deadline.expired:  # the body was cut short
                raise Failed(f"{target.origin}: timed out after {timeout:g} s")
            if url is None:
                return
    raise Failed(f"more than {redirects} redirects")


def _get_into(url, target, out, max_bytes, *, connect, total):
    """One GET: the next URL for a redirect, else None once the body is in ``out``."""
    with session(target, connect=connect, total=total) as pinned:
        with pinned.get(url, stream=True, allow_redirects=False) as response:
            if response.is_redirect:
                return urllib.parse.urljoin(url, response.headers["location"])
            if response.status_code != 200:
                raise Failed(f"{target.origin} answered {response.status_code} {response.reason}", response.status_code)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise TooLarge(f"{target.origin}: {declared} bytes is more than the limit of {max_bytes}")
            out.seek(0)
            out.truncate()
            size = 0
            for chunk in response.iter_content(1 << 20):
                size += len(chunk)
                if size > max_bytes:
                    raise TooLarge(f"{target.origin}: more than the limit of {max_bytes} bytes")
                out.write(chunk)
    return None
