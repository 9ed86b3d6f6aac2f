"""A host's power through its BMC's Redfish service (OpenStack's ``sushy`` client).

``Session(bmc)`` connects once (``BMCError`` if the BMC refuses the login, does not answer
within ``VCLMGR_BMC_TIMEOUT`` or has no such system); ``state()`` reads the power state as
``on`` / ``off`` / ``unknown`` (a BMC reporting PoweringOn/Off is ``unknown`` until it
settles); ``reset(kind)`` asks for one of Redfish's ResetTypes the system allows; ``wait(state,
seconds)`` polls until it is reached. Nothing here writes to the database.

The secret is read from the credential only to hand to the client; messages are built from
the BMC's address and the error's text, never from the credential. Before anything is sent the
address passes ``core.outbound``'s policy (no internal address unless allow-listed; every
request to that one checked address, none to another origin a BMC's answer names), and a
credential goes only to an origin it was saved for (``Credential.endpoints``) and only over
https:// unless the host allows http:// (``bmc_allow_http``).
"""

import logging
import time
import warnings

import sushy
from django.conf import settings
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_errors
from urllib3.exceptions import InsecureRequestWarning

from core import outbound
from inventory.bmc import BMCError

log = logging.getLogger(__name__)

SYSTEMS = "/redfish/v1/Systems/"
POLL_SECONDS = 0.5

_STATES = {sushy.PowerState.ON: "on", sushy.PowerState.OFF: "off"}


def system_path(system):
    """A system id or path as the path sushy wants (``/redfish/v1/Systems/<id>``)."""
    system = system.strip()
    if system.startswith("/"):
        return system
    return SYSTEMS + system


class Session:
    def __init__(self, bmc, timeout=None):
        self.bmc = bmc
        self.timeout = timeout or settings.VCLMGR_BMC_TIMEOUT
        credential = bmc.credential
        target = self._target(bmc, self.timeout)
        username = credential.username if credential else ""
        password = credential.get_secret() if credential else ""
        with self._errors("connect"):
            connector = sushy_connector.Connector(
                bmc.address.rstrip("/"),
                verify=bmc.verify_tls,
                server_side_retries=1,  # one try: sushy reads 0 as its default, 3 (a job retries instead)
                server_side_retries_delay=1,
                default_request_timeout=self.timeout,
                connect_timeout=self.timeout,
            )
            # sushy offers no other way to hand it a session: its own, pinned to the checked address.
            pinned = outbound.pin(connector._session, target, connect=self.timeout, total=self.timeout)
            self.root = sushy.Sushy(
                bmc.address.rstrip("/"),
                auth=sushy_auth.BasicAuth(username, password),
                connector=connector,
                public_connector=pinned,
            )
            self.system = self.root.get_system(self._identity())

    @staticmethod
    def _target(bmc, timeout):
        """The checked address to connect to; BMCError if the policy or the credential's binding refuses."""
        where = f"BMC {bmc.address}"
        try:
            target = outbound.check(bmc.address, timeout=timeout)
        except outbound.Refused as exc:
            raise BMCError(f"{where}: not allowed: {exc} (VCLMGR_OUTBOUND_ALLOW names exceptions)", "refused") from None
        except outbound.Failed as exc:
            raise BMCError(f"{where}: no answer ({exc})", "unreachable") from None
        credential = bmc.credential
        if credential is None:
            return target
        if not credential.sends_to(bmc.address):
            raise BMCError(
                f"{where}: credential {credential.name} was not saved for {target.origin}; to use it there, save "
                "the credential again with its secret and this address among its endpoints",
                "auth",
            )
        if target.scheme != "https" and not bmc.allow_http:
            raise BMCError(
                f"{where}: a credential is sent over https:// only (bmc_allow_http allows http:// for this host)",
                "refused",
            )
        return target

    def _identity(self):
        if self.bmc.system:
            return system_path(self.bmc.system)
        members = sorted(self.root.get_system_collection().members_identities)
        if len(members) != 1:
            raise BMCError(
                f"the BMC at {self.bmc.address} has {len(members)} systems: set the host's bmc_system "
                f"(one of {', '.join(m.rsplit('/', 1)[-1] for m in members[:10]) or 'none'})",
                "refused",
            )
        return members[0]

    def _errors(self, doing):
        return _Translate(self.bmc.address, doing, self.bmc.verify_tls)

    def state(self, refresh=True):
        with self._errors("read the power state"):
            if refresh:
                self.system.refresh(force=True)
            return _STATES.get(self.system.power_state, "unknown")

    def allowed(self):
        with self._errors("read the allowed reset types"):
            return {str(v.value) for v in self.system.get_allowed_reset_system_values()}

    def reset(self, kind):
        """Ask for one ResetType (``On``, ``ForceOn``, ``GracefulShutdown``, ``ForceOff``)."""
        with self._errors(f"request {kind}"):
            self.system.reset_system(sushy.ResetType(kind))

    def wait(self, wanted, seconds):
        """Poll until the system reports ``wanted``; True if it did within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            if self.state() == wanted:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)


class _Translate:
    """sushy's and requests' errors → BMCError with a message fit for the host's page."""

    def __init__(self, address, doing, verify):
        self.address, self.doing, self.verify = address, doing, verify
        self._warnings = warnings.catch_warnings()

    def __enter__(self):
        self._warnings.__enter__()
        if not self.verify:  # the administrator chose not to check this BMC's certificate
            warnings.simplefilter("ignore", InsecureRequestWarning)
        return self

    def __exit__(self, kind, exc, tb):
        self._warnings.__exit__(kind, exc, tb)
        if exc is None or isinstance(exc, BMCError):
            return False
        where = f"BMC {self.address}: cannot {self.doing}"
        if isinstance(exc, sushy_errors.AccessError):
            raise BMCError(f"{where}: the BMC refused the credential (HTTP {exc.status_code})", "auth") from None
        if isinstance(exc, sushy_errors.ResourceNotFoundError):
            raise BMCError(f"{where}: no such Redfish system ({_short(exc)})", "refused") from None
        if isinstance(exc, sushy_errors.ConnectionError):
            raise BMCError(f"{where}: no answer ({_cause(exc)})", "unreachable") from None
        if isinstance(exc, sushy_errors.HTTPError):
            raise BMCError(f"{where}: HTTP {exc.status_code}: {_short(exc)}", "refused") from None
        if isinstance(exc, (sushy_errors.SushyError, ValueError)):
            raise BMCError(f"{where}: {_short(exc)}", "refused") from None
        if isinstance(exc, OSError):
            raise BMCError(f"{where}: no answer ({_short(exc)})", "unreachable") from None
        if isinstance(exc, (AttributeError, TypeError, KeyError, IndexError)):
            # sushy reads the BMC's JSON as Redfish says it is shaped (an error answer's body an
            # object, say): an answer of another shape is the BMC's fault, not ours.
            log.warning("BMC %s: cannot %s: unexpected answer", self.address, self.doing, exc_info=True)
            raise BMCError(f"{where}: its answer is not what Redfish describes", "refused") from None
        return False


def _short(exc):
    return str(exc)[:300]


def _cause(exc):
    text = str(exc)
    for hint, says in (
        ("CERTIFICATE_VERIFY_FAILED", "its TLS certificate is not trusted; set bmc_verify_tls off to skip the check"),
        ("timed out", f"timed out after {settings.VCLMGR_BMC_TIMEOUT} s"),
        ("Read timed out", f"timed out after {settings.VCLMGR_BMC_TIMEOUT} s"),
        ("Connection refused", "connection refused"),
    ):
        if hint in text:
            return says
    return text[:300]
