"""Sign-on and mail servers that accept a connection and never answer (tests/silent_peer.py):
each call fails within its setting's timeout instead of holding its thread. (LDAP's and OpenID
Connect's are in test_signon_ldap.py and test_oidc.py, the webhooks' in tests/notifications.)"""

import smtplib

import pytest
from django.core import mail

from accounts import saml
from accounts.saml_config import saml_settings
from core.env import Env
from tests import processes
from tests.saml_idp import sp_keys  # noqa: F401 (fixture)
from tests.silent_peer import SilentPeer, outcome_within


def test_smtp_gives_up_on_a_silent_server_after_EMAIL_TIMEOUT(settings):
    with SilentPeer() as peer:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", peer.port, 1
        _, error, took = outcome_within(10, mail.send_mail, "subject", "body", "vclmgr@localhost", ["ann@localhost"])
        assert isinstance(error, (TimeoutError, smtplib.SMTPServerDisconnected)), error
        assert peer.accepted == 1 and took < 10


@pytest.fixture
def silent_idp(settings, sp_keys):  # noqa: F811
    key, cert = sp_keys
    with SilentPeer() as peer:
        environ = {
            "SAML_BASE_URL": "http://testserver",
            "SAML_METADATA_REMOTE": f"http://127.0.0.1:{peer.port}/idp/metadata",
            "SAML_KEY_FILE": key,
            "SAML_CERT_FILE": cert,
            "SAML_HTTP_CLIENT_TIMEOUT": "0.5",
        }
        for name, value in saml_settings(Env(environ), debug=True).items():
            setattr(settings, name, value)
        saml.forget_config()
        yield peer
    saml.forget_config()  # once the peer has hung up: a fetch still waiting on it holds the config's lock


def test_remote_saml_metadata_from_a_silent_idp_fails_within_its_timeout(silent_idp):
    _, error, took = outcome_within(10, saml.sp_config)
    assert isinstance(error, saml.IdPUnavailable) and "timed out" in str(error), error
    assert silent_idp.accepted == 1 and took < 5


def test_the_saml_timeout_is_read_strictly(sp_keys):  # noqa: F811
    key, cert = sp_keys
    environ = {
        "SAML_BASE_URL": "http://testserver",
        "SAML_METADATA_REMOTE": "http://127.0.0.1:9/md",
        "SAML_KEY_FILE": key,
        "SAML_CERT_FILE": cert,
    }
    assert saml_settings(Env(environ), debug=True)["SAML_CONFIG"]["http_client_timeout"] == 10.0
    with pytest.raises(Exception, match="SAML_HTTP_CLIENT_TIMEOUT: expected a number"):
        saml_settings(Env({**environ, "SAML_HTTP_CLIENT_TIMEOUT": "soon"}), debug=True)


def test_the_driver_timeouts_default_to_the_documented_values():
    from django.conf import settings

    assert (settings.VCLMGR_LIBVIRT_OPEN_TIMEOUT, settings.VCLMGR_LIBVIRT_CALL_TIMEOUT) == (10.0, 60)
    assert settings.VCLMGR_VSPHERE_TIMEOUT == 30.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VCLMGR_LIBVIRT_OPEN_TIMEOUT": "soon"}, "VCLMGR_LIBVIRT_OPEN_TIMEOUT: expected a number"),
        ({"VCLMGR_LIBVIRT_CALL_TIMEOUT": "1"}, "VCLMGR_LIBVIRT_CALL_TIMEOUT: must be at least 2"),
        ({"VCLMGR_VSPHERE_TIMEOUT": "0"}, "VCLMGR_VSPHERE_TIMEOUT: must be at least 0.1"),
    ],
)
def test_a_bad_driver_timeout_stops_the_start_naming_it(tmp_path, env, message):
    code = "from django.conf import settings\nsettings.VCLMGR_VSPHERE_TIMEOUT\n"
    result = processes.settings_child(code, VCLMGR_VAR_DIR=str(tmp_path), **env)
    assert result.returncode != 0 and message in result.stderr
