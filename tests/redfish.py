"""OpenStack's Redfish emulator (``sushy-emulator`` from sushy-tools) as a BMC for tests.

Its fake driver keeps each system's power state in memory and applies a reset 1–11 s later,
as real hardware does, so a test sees a BMC that takes its time. It is served over HTTPS
with a self-signed certificate made here, behind HTTP basic authentication (a bcrypt
htpasswd file), on a free 127.0.0.1 port; started and stopped by PID. No pytest or Django
in here.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import requests

from tests.certificates import self_signed

USERNAME = "redfish-admin"
PASSWORD = "bmc-pass-1"  # noqa: S105 (a test BMC on loopback)
BINARY = Path(sys.executable).parent / "sushy-emulator"
STATES = {"on": "On", "off": "Off"}


class EmulatorError(RuntimeError):
    pass


def _die_with_parent():
    """In the child: SIGTERM when the test process dies, even killed (no fixture teardown then)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Emulator:
    """One sushy-emulator process; ``systems``: {name: uuid} of its fake machines."""

    directory: Path
    initial: dict  # {name: "on" | "off"}
    tls: bool = True
    min_delay: int = 0  # > 0: every reset takes at least this many seconds (see slow_emulator.py)
    port: int = 0
    systems: dict = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def url(self):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _command(self):
        if self.min_delay:
            return [sys.executable, str(Path(__file__).parent / "data" / "redfish" / "slow_emulator.py")]
        return [str(BINARY)]

    def start(self, timeout=30):
        if not BINARY.exists():
            raise EmulatorError(f"{BINARY} is missing: pip install -r requirements-dev.txt (sushy-tools)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.systems = {name: str(uuid.uuid4()) for name in self.initial}
        fake = [
            {
                "uuid": self.systems[name],
                "name": name,
                "power_state": STATES[state],
                "external_notifier": False,
                "nics": [],
            }
            for name, state in self.initial.items()
        ]
        auth = self.directory / "htpasswd"
        auth.write_text(f"{USERNAME}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
        config = {
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_FAKE_SYSTEMS": fake,
            "SUSHY_EMULATOR_AUTH_FILE": str(auth),
            "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
            "SUSHY_EMULATOR_STATE_DIR": str(self.directory / "state"),
        }
        if self.tls:
            cert, key = self_signed(self.directory, "bmc")
            config.update(SUSHY_EMULATOR_SSL_CERT=str(cert), SUSHY_EMULATOR_SSL_KEY=str(key))
        conf = self.directory / "emulator.conf"
        conf.write_text("".join(f"{k} = {v!r}\n" for k, v in config.items()))
        self.port = free_port()
        log = open(self.directory / "emulator.log", "wb")  # noqa: SIM115 (the child keeps writing to it)
        self.process = subprocess.Popen(
            [*self._command(), "--config", str(conf), "--port", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env={**os.environ, "SUSHY_EMULATOR_CONFIG": "", "BMC_MIN_DELAY": str(self.min_delay)},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmulatorError(f"sushy-emulator exited {self.process.returncode}:\n{self.output()}")
            try:
                requests.get(f"{self.url}/redfish/v1/", verify=False, timeout=1)  # noqa: S501 (our own test cert)
                return self
            except requests.RequestException:
                time.sleep(0.1)
        self.stop()
        raise EmulatorError(f"sushy-emulator did not answer within {timeout} s:\n{self.output()}")

    def output(self):
        path = self.directory / "emulator.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # its own session: the emulator and nothing else
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def system_path(self, name):
        return f"/redfish/v1/Systems/{self.systems[name]}"

    def power_state(self, name):
        """What the emulator says, read past vclmgr (``On`` / ``Off``)."""
        answer = requests.get(
            self.url + self.system_path(name),
            auth=(USERNAME, PASSWORD),
            verify=False,
            timeout=5,  # noqa: S501
        )
        answer.raise_for_status()
        return answer.json()["PowerState"]

    def wait_for(self, name, wanted, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.power_state(name) == wanted:
                return True
            time.sleep(0.2)
        return False


class SilentPort:
    """A port that accepts connections and never answers (a BMC that hangs)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def close(self):
        self.sock.close()
