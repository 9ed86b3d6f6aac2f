"""A real OpenLDAP server for tests: Debian's slapd, never its system service.

``Directory.start()`` converts ``tests/data/ldap/slapd.conf`` into a cn=config directory with
``slaptest`` after loading ``directory.ldif`` into a fresh MDB database with ``slapadd``, and runs
``slapd`` in the foreground on two loopback ports (``ldap://`` with StartTLS, ``ldaps://``;
its certificate is signed by a CA made here, ``ca_file``); ``stop()`` ends it by its PID. ``modify(ldif)``
changes the directory through ``ldapmodify`` as its root DN, as an administrator would.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.processes import free_port, listens

DATA = Path(__file__).resolve().parent / "data" / "ldap"
BASE = "dc=campus,dc=example"
ROOT_DN = f"cn=admin,{BASE}"
ROOT_PASSWORD = "admin-secret"  # noqa: S105 (the test directory's)
TOOLS = ("slapd", "slaptest", "slapadd", "ldapmodify")


def missing_tools():
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [tool for tool in TOOLS if shutil.which(tool, path=path) is None]


def _tool(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def _run(*args, input=None):
    done = subprocess.run(args, input=input, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{Path(args[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def _write_certificates(folder):
    """A CA and a server certificate for 127.0.0.1 signed by it (ca.pem, server.pem, server.key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def make(subject, issuer, key, signer, ca, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vclmgr test CA")])
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    ca = make(ca_name, ca_name, ca_key, ca_key, True)
    server = make(server_name, ca_name, key, ca_key, False, [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(server.public_bytes(pem))
    (folder / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


class Directory:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="vclmgr-slapd-"))
        self.port, self.tls_port = free_port(), free_port()
        self.uri = f"ldap://127.0.0.1:{self.port}"
        self.ldaps_uri = f"ldaps://127.0.0.1:{self.tls_port}"
        self.ca_file = self.dir / "ca.pem"
        self.process = None

    def start(self):
        try:
            self._prepare()
            log = open(self.dir / "slapd.log", "wb")  # noqa: SIM115 (kept open for the child)
            self.process = subprocess.Popen(
                [_tool("slapd"), "-d", "0", "-h", f"{self.uri}/ {self.ldaps_uri}/", "-F", str(self.dir / "config")],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + 10
            while not (listens(self.port) and listens(self.tls_port)):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"slapd did not start: {(self.dir / 'slapd.log').read_text()[-2000:]}")
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self):
        (self.dir / "db").mkdir()
        (self.dir / "config").mkdir()
        _write_certificates(self.dir)
        conf = self.dir / "slapd.conf"
        conf.write_text((DATA / "slapd.conf").read_text().replace("@DIR@", str(self.dir)))
        # Load first: slaptest opens the database it converts.
        _run(_tool("slapadd"), "-f", str(conf), "-b", BASE, "-l", str(DATA / "directory.ldif"))
        _run(_tool("slaptest"), "-f", str(conf), "-F", str(self.dir / "config"))

    def modify(self, ldif):
        _run(_tool("ldapmodify"), "-x", "-H", self.uri, "-D", ROOT_DN, "-w", ROOT_PASSWORD, input=ldif)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
