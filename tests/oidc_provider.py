"""A real OpenID provider for tests: the django-oauth-toolkit project in
``tests/data/oidc_provider`` run by ``runserver`` on a free loopback port with its own SQLite
database and a fresh RSA key, stopped by PID."""

import json
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests import processes
from tests.processes import ROOT, Child, free_port, listens, wait_for

PROJECT = ROOT / "tests" / "data" / "oidc_provider"
CLIENT_ID = "vclmgr"
CLIENT_SECRET = "client-secret-for-tests"  # noqa: S105
GROUP_MAP = {"cs101-students": "cs101", "cs102-students": "cs102"}


def rsa_pem():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class Provider:
    def __init__(self, directory):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "key.pem").write_text(rsa_pem())
        self.env = {"IDP_DIR": str(self.dir), "PYTHONPATH": str(PROJECT), "PATH": "/usr/bin:/bin"}
        self.manage("migrate", "-v0")
        # RFC 8252: a loopback redirect matches on any port, so one registration fits every server.
        self.manage("idp_client", CLIENT_ID, CLIENT_SECRET, "http://127.0.0.1/oidc/callback/")
        port = free_port()
        self.child = Child(self._django("runserver", f"127.0.0.1:{port}", "--noreload"), self.env, self.dir / "idp.log")
        wait_for(lambda: listens(port), 30, "the OpenID provider to listen", self.child)
        self.url = f"http://127.0.0.1:{port}"
        self.discovery_url = f"{self.url}/o/.well-known/openid-configuration"

    def _django(self, *args):
        return [sys.executable, "-m", "django", *args, "--settings", "idp.settings"]

    def manage(self, *args):
        import subprocess

        subprocess.run(self._django(*args), cwd=PROJECT, env=self.env, check=True, timeout=120)

    def user(self, username, password, email="", groups=(), first_name="", last_name=""):
        self.manage(
            "idp_user",
            username,
            password,
            "--email",
            email,
            "--groups",
            ",".join(groups),
            "--first-name",
            first_name,
            "--last-name",
            last_name,
        )

    def stop(self):
        self.child.stop()


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    """The provider with ``ann`` (in cs101-students) and the misbehaving users (``mallory-*``)."""
    idp = Provider(tmp_path_factory.mktemp("idp"))
    try:
        idp.user("ann", "ann-pass", email="ann@uni.example", groups=["cs101-students"], first_name="Ann")
        idp.user("mallory-aud", "pw")
        idp.user("mallory-nonce", "pw")
        idp.user("mallory-sub", "pw")
        idp.user("mallory-iss", "pw")
        idp.user("mallory-exp", "pw")
        yield idp
    finally:
        idp.stop()


def start_vclmgr(tmp_path, provider, **extra):
    """vclmgr's daphne signing on through ``provider``."""
    env = {
        "OIDC_RP_CLIENT_ID": CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_OP_DISCOVERY_URL": provider.discovery_url,
        "OIDC_GROUP_MAP": json.dumps(GROUP_MAP),
        "OIDC_PROVIDER_NAME": "Campus ID",
        **extra,
    }
    return processes.start_asgi(tmp_path, **env)


@pytest.fixture(scope="module")
def vclmgr_process(django_db_setup, tmp_path_factory, provider):
    """One vclmgr of the default configuration for a module's tests: what they prove is how a
    running relying party answers each callback, which does not depend on it being fresh (its
    state is in the database, emptied after each test; its log is read from where the test
    began)."""
    child = start_vclmgr(tmp_path_factory.mktemp("vclmgr"), provider)
    yield child
    child.kill()


@pytest.fixture
def shared_vclmgr(transactional_db, vclmgr_process):
    """``vclmgr_process`` for one test (import both, as ``vclmgr`` and ``vclmgr_process``)."""
    return vclmgr_process.begin()


@pytest.fixture
def vclmgr(transactional_db, tmp_path, provider):
    child = start_vclmgr(tmp_path, provider)
    yield child
    child.stop()
