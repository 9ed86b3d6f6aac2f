"""Real hypervisor peers for the driver tests: the simulator, libvirt's test driver, vcsim.

None of these tests is ever skipped: a missing binary or package fails them with a message
saying what ``make install-dev`` must install.

- ``sim_peer``: two SimHosts in the test database.
- ``libvirt_peer``: two ``test:///<tmp>/kvm-*.xml`` nodes copied from ``tests/data/libvirt``
  (a fresh copy per test, so each test starts with empty hosts).
- ``vmware_peer``: two hosts of VMware's vSphere simulator (``tools/vcsim``), built once and
  cached, started once per test session and xdist worker (fixture ``vcsim``, tests/vcsim.py).
"""

import hashlib
import itertools
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from drivers.base import ImageVariantSpec, VMSpec

ROOT = Path(__file__).resolve().parents[2]
LIBVIRT_NODES = ROOT / "tests" / "data" / "libvirt"
INSTALL_HINT = "the Makefile's install-dev target must install it (see the Makefile's APT_TEST and requirements.txt)"

_keys = itertools.count(1000)


def next_key():
    """A VM key unique within this worker (vcsim lives for the whole session)."""
    return f"vcl-{next(_keys)}"


@dataclass
class Peer:
    """Two hosts of one hypervisor family, an image they run, and spec defaults."""

    kind: str
    source: object
    target: object
    image: ImageVariantSpec
    spec_extra: dict = field(default_factory=dict)
    made: list = field(default_factory=list)

    def spec(self, key=None, image=None, **overrides):
        key = key or next_key()
        self.made.append(key)
        values = {
            "vcpus": 2,
            "memory_mib": 1024,
            "disk_gib": 10,
            "image": image or self.image,
            "extra": self.spec_extra,
            **overrides,
        }
        return VMSpec(key=key, **values)

    def cleanup(self):
        for driver in (self.source, self.target):
            for key in self.made:
                try:
                    driver.destroy(key)
                except Exception:  # noqa: BLE001, S110 (best effort; the test's own asserts matter)
                    pass


def image_file(tmp_path, name, fmt, content=b"vclmgr test image\n"):
    path = tmp_path / f"{name}.{fmt}"
    path.write_bytes(content)
    return ImageVariantSpec(
        name=name, format=fmt, location=str(path), checksum="sha256:" + hashlib.sha256(content).hexdigest(), size_gib=4
    )


# --- sim ----------------------------------------------------------------------------------


@pytest.fixture
def sim_peer(db, tmp_path):
    from drivers.sim.driver import SimDriver

    peer = Peer(
        "sim",
        SimDriver("sim://sim-a", options={"cpus": 8, "memory_mib": 16384, "disk_gib": 200}),
        SimDriver("sim://sim-b", options={"cpus": 32, "memory_mib": 131072, "disk_gib": 2000}),
        image_file(tmp_path, "ubuntu-24.04", "qcow2"),
    )
    yield peer
    peer.cleanup()


# --- libvirt ------------------------------------------------------------------------------


def schema_check(path, kind):
    """libvirt's own schema check of the XML file ``path`` as ``kind`` (domain, network, nodedev):
    the finished ``virt-xml-validate`` run. The tool missing fails the test: make install-dev
    installs it (libvirt-clients, and libxml2-utils for the xmllint it runs)."""
    import subprocess

    tool = shutil.which("virt-xml-validate")
    if tool is None:
        pytest.fail("virt-xml-validate is missing: make install-dev installs libvirt-clients", pytrace=False)
    return subprocess.run([tool, str(path), kind], capture_output=True, text=True, timeout=60, check=False)


def valid_for_libvirt(tmp_path, xml_text, kind):
    """Assert that ``xml_text`` passes libvirt's schema for ``kind``."""
    path = tmp_path / f"{kind}.xml"
    path.write_text(xml_text)
    done = schema_check(path, kind)
    assert done.returncode == 0, done.stdout + done.stderr


def require_libvirt():
    try:
        import libvirt  # noqa: F401
    except ImportError as exc:
        pytest.fail(
            f"libvirt-python is not importable ({exc}); {INSTALL_HINT} (Debian libvirt-dev, pkg-config)", pytrace=False
        )


@pytest.fixture
def libvirt_nodes(tmp_path):
    """``name → test:///…/<name>.xml``: private copies, so every test starts from empty hosts."""
    require_libvirt()
    from drivers.libvirt.connection import connections

    nodes = tmp_path / "nodes"
    nodes.mkdir()
    uris = {}
    for path in sorted(LIBVIRT_NODES.glob("*.xml")):
        shutil.copy(path, nodes / path.name)
        uris[path.stem] = f"test://{nodes / path.name}"
    yield uris
    for uri in uris.values():
        connections.forget(uri)


@pytest.fixture
def libvirt_peer(libvirt_nodes, tmp_path):
    from drivers.libvirt.driver import LibvirtDriver

    peer = Peer(
        "libvirt",
        LibvirtDriver(libvirt_nodes["kvm-small"]),
        LibvirtDriver(libvirt_nodes["kvm-medium"]),
        image_file(tmp_path, "ubuntu-24.04", "qcow2"),
    )
    yield peer
    peer.cleanup()


# --- vmware -------------------------------------------------------------------------------


@pytest.fixture
def vmware_peer(vcsim, tmp_path):
    cluster = [host["name"] for host in vcsim.hosts if "_C" in host["name"]]
    source, target = vcsim.driver(cluster[0]), vcsim.driver(cluster[1])
    # vcsim lives for the session: content unique to this test, so no test finds another's staged image.
    image = image_file(tmp_path, "ubuntu-24.04", "vmdk", content=f"vmdk of {tmp_path.name}\n".encode())
    peer = Peer("vmware", source, target, image)
    # vcsim has no VMware Tools: this is how the simulator lets a test play the guest reporting its address.
    peer.spec_extra = {"vmware.extra_config": {"SET.guest.ipAddress": "10.99.0.7"}}
    yield peer
    peer.cleanup()


@pytest.fixture(params=["sim", "libvirt", pytest.param("vmware", marks=pytest.mark.slow)])
def peer(request, db):
    """The contract suite runs once per hypervisor family.

    ``db`` is requested here, not only through ``sim_peer``: pytest-django does not set the
    test database up for a ``db`` reached through ``getfixturevalue`` alone.
    """
    return request.getfixturevalue(f"{request.param}_peer")


@pytest.fixture
def silent_libvirt(settings):
    """``silent_libvirt()``: a new silent peer (tests/silent_peer.py) for ``qemu+tcp://`` URIs, with
    VCLMGR_LIBVIRT_OPEN_TIMEOUT at 0.5 s; all closed after the test, and the opens given up on
    them seen to end."""
    from drivers.libvirt import connection
    from tests.silent_peer import SilentPeer, wait_for

    settings.VCLMGR_LIBVIRT_OPEN_TIMEOUT = 0.5
    started = []

    def start():
        started.append(SilentPeer())
        return started[-1]

    yield start
    for peer in started:
        peer.close()
    wait_for(lambda: connection._opening.under_way() == 0, "given-up opens end once their peers hang up")
    connection.connections.forget()
