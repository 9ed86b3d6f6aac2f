"""A real SAML identity provider for tests: pysaml2's IdP (tests/data/saml/idp.py) in its own
process on a free loopback port, with a key pair made here, stopped by PID; and vclmgr's daphne
signing on through it (its own SP key pair, made here too)."""

import datetime
import json
import sys

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests import processes
from tests.processes import ROOT, Child, free_port, listens, wait_for

IDP_SCRIPT = ROOT / "tests" / "data" / "saml" / "idp.py"
GROUP_MAP = {
    "eduPersonAffiliation": {"faculty": "faculty", "student": "students"},
    "eduPersonEntitlement": {
        "urn:mace:uni.example:course:cs101": "cs101",
        "urn:mace:uni.example:course:cs102": "cs102",
    },
}


def key_pair(directory, name, common_name):
    """A fresh RSA key and a self-signed certificate for it, as PEM files; returns their paths."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    key_file, cert_file = directory / f"{name}key.pem", directory / f"{name}cert.pem"
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


def student(principal, affiliation=("student", "member"), courses=("cs101",), mode=None):
    name = principal.split("@")[0]
    return {
        "password": f"{name}-pass",
        "mode": mode,
        "attributes": {
            "eduPersonPrincipalName": [principal],
            "mail": [f"{name}@uni.example"],
            "givenName": [name.capitalize()],
            "sn": ["Student"],
            "eduPersonAffiliation": list(affiliation),
            "eduPersonEntitlement": [f"urn:mace:uni.example:course:{c}" for c in courses],
        },
    }


class IdentityProvider:
    def __init__(self, directory):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        key_pair(self.dir, "", "test campus IdP")
        key_pair(self.dir, "rogue-", "test campus IdP")
        self.users = {
            "ann": student("ann@uni.example"),
            "mallory-sig": student("mallory-sig@uni.example", mode="tamper"),
            "mallory-aud": student("mallory-aud@uni.example", mode="other-audience"),
            **{
                f"mallory-{mode}": student(f"mallory-{mode}@uni.example", mode=mode)
                for mode in ("unsigned", "response-only", "rogue-key", "expired")
            },
        }
        self.save()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
        self.child = Child([sys.executable, str(IDP_SCRIPT), str(self.dir), str(port)], env, self.dir / "idp.log")
        wait_for(lambda: listens(port), 30, "the SAML IdP to listen", self.child)
        self.metadata_url = f"{self.url}/metadata"
        self.metadata_file = self.dir / "metadata.xml"

    def save(self):
        (self.dir / "users.json").write_text(json.dumps(self.users))

    def events(self, kind):
        path = self.dir / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [event for event in map(json.loads, lines) if event["event"] == kind]

    def stop(self):
        self.child.stop()


@pytest.fixture(scope="module")
def idp(tmp_path_factory):
    provider = IdentityProvider(tmp_path_factory.mktemp("saml-idp"))
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def sp_keys(tmp_path_factory):
    return key_pair(tmp_path_factory.mktemp("saml-sp"), "sp-", "vclmgr test SP")


def start_vclmgr(tmp_path, idp, sp_keys, **extra):
    """vclmgr's daphne signing on through ``idp`` (its metadata by URL unless ``extra`` says)."""
    port = free_port()
    key, cert = sp_keys
    env = {
        "SAML_BASE_URL": f"http://127.0.0.1:{port}",
        "SAML_METADATA_REMOTE": idp.metadata_url,
        "SAML_KEY_FILE": key,
        "SAML_CERT_FILE": cert,
        "SAML_GROUP_MAP": json.dumps(GROUP_MAP),
        "SAML_PROVIDER_NAME": "Campus SSO",
        **extra,
    }
    return processes.start_asgi(tmp_path, port=port, **{k: v for k, v in env.items() if v is not None})


@pytest.fixture(scope="module")
def vclmgr_process(django_db_setup, tmp_path_factory, idp, sp_keys):
    """One vclmgr of the default configuration for a module's tests: what they prove is how a
    running SP answers each response, which does not depend on the SP being fresh (its state is
    in the database, emptied after each test; its log is read from where the test began)."""
    child = start_vclmgr(tmp_path_factory.mktemp("vclmgr"), idp, sp_keys)
    yield child
    child.kill()


@pytest.fixture
def shared_vclmgr(transactional_db, vclmgr_process):
    """``vclmgr_process`` for one test (import both, as ``vclmgr`` and ``vclmgr_process``)."""
    return vclmgr_process.begin()


@pytest.fixture
def vclmgr(transactional_db, tmp_path, idp, sp_keys):
    child = start_vclmgr(tmp_path, idp, sp_keys)
    yield child
    child.stop()
