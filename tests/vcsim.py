"""VMware's vSphere simulator (``tools/vcsim``, built once from Debian's govmomi and cached):
one per test session and xdist worker, for every test that asks for the fixture ``vcsim``
(tests/conftest.py makes it known everywhere, so there is one definition and one process)."""

import json
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL_HINT = "the Makefile's install-dev target must install it (see the Makefile's APT_TEST and requirements.txt)"
VCSIM_BUILD = ROOT / "tools" / "vcsim" / "build.sh"
VCSIM_USER, VCSIM_PASSWORD = "vclmgr", "vcsim-secret"  # noqa: S105 (the simulator's, made up here)
# Four hosts: a cluster of three and one standalone, each with its own capacity.
VCSIM_ARGS = ["-cluster", "1", "-host", "3", "-standalone-host", "1",
              "-host-cpus", "8,16,24,32", "-host-memory-mib", "16384,32768,49152,65536"]  # fmt: skip


@dataclass
class Vcsim:
    url: str  # without credentials, like a production URI
    port: int
    hosts: list  # [{"name", "cpus", "memory_mib"}] as the simulator reports them

    @property
    def credentials(self):
        return {"username": VCSIM_USER, "password": VCSIM_PASSWORD}

    def driver(self, host, **options):
        from drivers.vmware.driver import VMwareDriver

        return VMwareDriver(self.url, self.credentials, {"host": host, **options})


def cluster_host(vcsim, make_host, settings, guest_address, index=0, **fields):
    """A host of vcsim's cluster (its ``index``-th) in the inventory (driver vmware, the
    simulator's credential, ``fields`` over the defaults) whose guests report ``guest_address``:
    vcsim has no VMware Tools, and this advanced setting is how it lets a test play the guest
    reporting its address."""
    from inventory import services as inventory
    from inventory.models import Credential

    settings.VCLMGR_DRIVER_OPTIONS = {"vmware": {"extra_config": {"SET.guest.ipAddress": guest_address}}}
    credential = Credential.objects.filter(name="vcsim").first() or inventory.create_credential(
        actor="test", name="vcsim", username=VCSIM_USER, secret=VCSIM_PASSWORD, endpoints=[vcsim.url]
    )
    name = [host["name"] for host in vcsim.hosts if "_C" in host["name"]][index]
    values = {"cpus": 16, "memory_mib": 32768, "disk_gib": 200, **fields}
    return make_host(name, driver="vmware", uri=f"{vcsim.url}?host={name}", credential=credential, **values)


def distributed_switch(vcsim, name):
    """A distributed switch ``name`` with every host of vcsim's cluster as a member, made as an
    operator makes one (vcsim takes a VM's NIC on it only when every host of the VM's cluster is
    a member); ``remove_switch`` takes it away with the port groups left on it."""
    from pyVmomi import vim

    driver = vcsim.driver(next(host["name"] for host in vcsim.hosts if "_C" in host["name"]))
    config = vim.dvs.VmwareDistributedVirtualSwitch.ConfigSpec(name=name)
    create = vim.DistributedVirtualSwitch.CreateSpec(configSpec=config)
    switch = driver._wait(driver._datacenter().networkFolder.CreateDVS_Task(spec=create), f"make switch {name}")
    members = [
        vim.dvs.HostMember.ConfigSpec(operation="add", host=vcsim.driver(host["name"])._host())
        for host in vcsim.hosts
        if "_C" in host["name"]
    ]
    joined = vim.dvs.VmwareDistributedVirtualSwitch.ConfigSpec(host=members, configVersion=switch.config.configVersion)
    driver._wait(switch.ReconfigureDvs_Task(spec=joined), f"add the cluster's hosts to {name}")
    return switch


def remove_switch(vcsim, switch):
    driver = vcsim.driver(next(host["name"] for host in vcsim.hosts if "_C" in host["name"]))
    for group in switch.portgroup:
        if "-DVUplinks" not in group.name:
            driver._wait(group.Destroy_Task(), f"remove port group {group.name}")
    driver._wait(switch.Destroy_Task(), "remove the switch")


def vmdk_image(tmp_path, name, *, variant=(), **fields):
    """``name`` with one vmdk variant, a small guest. vcsim lives for the whole session: the
    disk's content is unique to this test, so no test finds another's staged image."""
    from tests.images import file_image

    return file_image(
        tmp_path / f"{name}.vmdk",
        f"vmdk of {tmp_path.name}\n".encode(),
        name,
        variant={"hypervisor_type": "vmware", "format": "vmdk", "size_gib": 1, **dict(variant)},
        **{"min_memory_mib": 256, "default_memory_mib": 512, "default_disk_gib": 10, **fields},
    )


def _vcsim_binary():
    try:
        import pyVmomi  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"pyVmomi is not importable ({exc}); {INSTALL_HINT}", pytrace=False)
    try:
        build = subprocess.run(["sh", str(VCSIM_BUILD)], capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot build vcsim: {exc}", pytrace=False)
    if build.returncode != 0:
        pytest.fail(
            f"cannot build vcsim (tools/vcsim/build.sh): {build.stderr.strip()[-2000:]}\n"
            f"Go and govmomi are needed: {INSTALL_HINT} (Debian golang-go golang-github-vmware-govmomi-dev)",
            pytrace=False,
        )
    return build.stdout.strip().splitlines()[-1]


def _first_line(proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            break
    return ""


@pytest.fixture(scope="session")
def vcsim(tmp_path_factory):
    """VMware's vSphere simulator on a free port, for this session (one per xdist worker)."""
    binary = _vcsim_binary()
    log_path = tmp_path_factory.mktemp("vcsim") / "vcsim.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                "-listen",
                "127.0.0.1:0",
                "-username",
                VCSIM_USER,
                "-password",
                VCSIM_PASSWORD,
                "-stdin-eof",
                *VCSIM_ARGS,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        line = _first_line(proc, timeout=60)
        if not line:
            pytest.fail(f"vcsim did not start: {log_path.read_text(errors='replace')[-2000:]}", pytrace=False)
        report = json.loads(line)
        url = report["url"].replace(f"{VCSIM_USER}:{VCSIM_PASSWORD}@", "")
        yield Vcsim(url=url, port=int(url.rsplit(":", 1)[1].split("/")[0]), hosts=report["hosts"])
    finally:
        proc.stdin.close()  # -stdin-eof: it also exits if we die without reaching here
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
