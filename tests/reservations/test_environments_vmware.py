"""An environment on a VMware host (vcsim): reserved through ``reservations.environments``, built
by the job runner, its private network a port group on the host's isolated vSwitch with every
member's NIC on it, all of it gone when the environment ends or fails. What the host holds is
read back through pyVmomi, not through the driver's own network helpers."""

import json
from datetime import timedelta

import pytest
from pyVmomi import vim

from drivers import registry as drivers
from environments import services as environment_services
from provisioning.models import VM, PrivateNetwork
from reservations import environments
from reservations import services as reservations
from reservations.models import Reservation
from tests.environments.conftest import member
from tests.vcsim import cluster_host, distributed_switch, remove_switch, vmdk_image

pytestmark = pytest.mark.slow  # starts vcsim (once per session and worker)
GUEST_ADDRESS = "10.99.0.9"
SWITCH = "vclmgr-private"


@pytest.fixture
def esx_host(vcsim, make_host, settings):
    return cluster_host(vcsim, make_host, settings, GUEST_ADDRESS)


@pytest.fixture
def lab(alice, tmp_path):
    """A server and two clients on one private network."""
    image = vmdk_image(tmp_path, "debian-vmware")
    return template(
        alice,
        [
            member("server", image, "lan", entry=True),
            member("client-a", image, "lan"),
            member("client-b", image, "lan"),
        ],
        [{"name": "lan", "cidr": "192.168.30.0/24"}],
    )


@pytest.fixture
def host_view(esx_host):
    """Reads the host as vSphere has it, through pyVmomi; and removes whatever a failing
    test left there (vcsim lives for the whole session)."""
    driver = drivers.driver_for(esx_host)
    view = HostView(driver.si, driver._host())
    yield view
    for vm in VM.objects.all():
        driver.destroy(vm.key)
    for name in view.port_groups():
        if name.startswith("env") and not name.startswith("env-"):
            view.network_system.RemovePortGroup(pgName=name)


class HostView:
    def __init__(self, si, host):
        self.si, self.host = si, host
        self.network_system = host.configManager.networkSystem

    def port_groups(self):
        """Port group name → (vSwitch, VLAN id)."""
        info = self.network_system.networkInfo
        return {pg.spec.name: (pg.spec.vswitchName, pg.spec.vlanId) for pg in info.portgroup or []}

    def records(self):
        """The networks vclmgr recorded in the host's custom attribute (their ranges)."""
        fields = {f.key: f.name for f in self.si.content.customFieldsManager.field}
        values = [v.value for v in self.host.customValue if fields.get(v.key) == "vclmgr.networks"]
        return json.loads(values[-1]) if values and values[-1] else {}

    def switch(self, name):
        return next(s for s in self.network_system.networkInfo.vswitch if s.name == name)

    def vm(self, key):
        return next(
            (vm for vm in self.si.content.rootFolder.childEntity[0].vmFolder.childEntity if vm.name == key), None
        )

    def nics(self, key):
        """Port group name → MAC of the VM's NICs."""
        devices = self.vm(key).config.hardware.device
        return {d.backing.deviceName: d.macAddress for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)}


def template(owner, members, networks):
    return environment_services.create_template(actor=owner, name="vmware-lab", members=members, networks=networks)


def all_ready(head):
    """The machines of the environment (as ``machines``), each of them ready."""
    rows = machines(head)
    assert {name: r.status for name, r in rows.items()} == dict.fromkeys(rows, "ready"), [
        r.error for r in rows.values()
    ]
    return rows


def machines(head):
    """Hostname → reservation of each machine of the environment, as written now."""
    return {r.hostname: r for r in environments.machines_of(Reservation.objects.get(pk=head.pk))}


def test_an_environment_gets_a_port_group_its_members_are_on_and_ending_it_removes_both(
    esx_host, lab, alice, sync_jobs, host_view
):
    head = environments.reserve(alice, lab, actor=alice, duration=timedelta(hours=2))
    key = f"env{head.pk}-lan"
    sync_jobs.drain()

    rows = all_ready(head)
    assert set(rows) == {"server", "client-a", "client-b"}
    switch, vlan = host_view.port_groups()[key]
    assert switch == SWITCH and 1 <= vlan <= 4094  # a VLAN of its own: port groups of one switch share VLAN 0
    assert not host_view.switch(SWITCH).pnic  # no uplink: the network reaches nothing outside the host
    network = PrivateNetwork.objects.get(key=key)
    assert sorted(network.members) == ["client-a", "client-b", "server"] and network.host == esx_host
    for name, row in rows.items():
        assert row.vm.state == "running" and row.vm.host == esx_host
        assert host_view.vm(row.vm.key).runtime.powerState == "poweredOn"
        nics = host_view.nics(row.vm.key)
        assert set(nics) == {"VM Network", key}, name  # its primary NIC, and one on the environment's network
        assert nics[key] == drivers.driver_for(esx_host).private_mac(name, key)

    reservations.end(Reservation.objects.get(pk=head.pk), actor=alice)
    sync_jobs.drain()

    assert {r.status for r in machines(head).values()} == {"ended"}
    assert all(host_view.vm(r.vm.key) is None for r in rows.values())
    assert key not in host_view.port_groups()
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()


def test_two_environments_on_one_host_get_port_groups_of_different_vlans(esx_host, lab, alice, sync_jobs, host_view):
    first = environments.reserve(alice, lab, actor=alice, duration=timedelta(hours=2))
    second = environments.reserve(alice, lab, actor=alice, duration=timedelta(hours=2))
    sync_jobs.drain()

    groups = host_view.port_groups()
    assert groups[f"env{first.pk}-lan"][0] == groups[f"env{second.pk}-lan"][0] == SWITCH
    assert groups[f"env{first.pk}-lan"][1] != groups[f"env{second.pk}-lan"][1]  # two broadcast domains
    for head in (first, second):
        reservations.end(Reservation.objects.get(pk=head.pk), actor=alice)
    sync_jobs.drain()
    assert not {f"env{first.pk}-lan", f"env{second.pk}-lan"} & set(host_view.port_groups())


def test_a_port_group_that_cannot_be_made_fails_the_environment_and_leaves_nothing(
    esx_host, alice, tmp_path, sync_jobs, host_view
):
    image = vmdk_image(tmp_path, "debian-vmware")
    lab = template(
        alice,
        [
            member("server", image, "backend", "lan", entry=True),
            member("client", image, "lan"),
            member("db", image, "backend"),
        ],
        [{"name": "lan", "cidr": "192.168.30.0/24"}, {"name": "backend", "cidr": "192.168.31.0/24"}],
    )
    head = environments.reserve(alice, lab, actor=alice, duration=timedelta(hours=2))
    key = f"env{head.pk}-lan"
    # Someone else's port group by that name, on the uplinked switch, made before the build. The
    # server's build makes its networks in key order: backend first, then lan fails.
    spec = vim.host.PortGroup.Specification(name=key, vlanId=0, vswitchName="vSwitch0", policy=vim.host.NetworkPolicy())
    host_view.network_system.AddPortGroup(portgrp=spec)
    try:
        sync_jobs.drain()

        head = Reservation.objects.get(pk=head.pk)
        rows = machines(head)
        # The server is built first (its job is the oldest): it made backend, then failed on lan.
        assert {name: r.status for name, r in rows.items()} == {"server": "failed", "client": "ended", "db": "ended"}
        assert "the environment failed: server could not be built" in head.error
        assert f"a network named {key} already exists on {esx_host.name}" in head.error
        assert "a port group on vSwitch vSwitch0, left alone" in head.error
        assert all(r.vm is None or host_view.vm(r.vm.key) is None for r in rows.values())
        assert not VM.objects.exclude(state__in=("destroyed", "failed")).exists()
        assert host_view.port_groups()[key] == ("vSwitch0", 0)  # someone else's: left alone
        assert f"env{head.pk}-backend" not in host_view.port_groups()  # made by the build, removed with it
        assert not {key, f"env{head.pk}-backend"} & set(host_view.records())
        assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()  # their ranges are free again
    finally:
        host_view.network_system.RemovePortGroup(pgName=key)


@pytest.fixture
def overlay_hosts(vcsim, make_host, settings):
    """Two hosts of vcsim's cluster in the inventory on one overlay: the operator's distributed
    switch of that name. Each has room for two of the lab's three machines, so its network
    spreads over both. The switch goes afterwards."""
    switch = distributed_switch(vcsim, "lab-overlay")
    hosts = [
        cluster_host(vcsim, make_host, settings, GUEST_ADDRESS, i, memory_mib=1024, overlay="lab-overlay")
        for i in range(2)
    ]
    yield switch, hosts
    for vm in VM.objects.all():
        drivers.driver_for(hosts[0]).destroy(vm.key)
    remove_switch(vcsim, switch)


def test_an_environment_over_two_hosts_of_an_overlay_shares_one_distributed_port_group(
    overlay_hosts, lab, alice, sync_jobs
):
    switch, hosts = overlay_hosts
    head = environments.reserve(alice, lab, actor=alice, duration=timedelta(hours=2))
    key = f"env{head.pk}-lan"
    sync_jobs.drain()

    rows = all_ready(head)
    assert {r.vm.host.name for r in rows.values()} == {h.name for h in hosts}  # spread over both
    networks = PrivateNetwork.objects.filter(key=key)
    assert {n.host.name for n in networks} == {h.name for h in hosts}
    assert {(n.overlay, n.segment) for n in networks} == {("lab-overlay", networks[0].segment)}
    group = next(g for g in switch.portgroup if g.name == key)
    assert group.config.defaultPortConfig.vlan.vlanId == networks[0].segment  # the segment is its VLAN
    assert {h.name for h in group.host} >= {h.name for h in hosts}  # the port group is on both hosts
    si = drivers.driver_for(hosts[0]).si
    view = HostView(si, drivers.driver_for(hosts[0])._host())
    for name, row in rows.items():
        vm = view.vm(row.vm.key)
        assert vm.runtime.powerState == "poweredOn" and vm.runtime.host.name == row.vm.host.name
        nics = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualEthernetCard)]
        on_it = [d for d in nics if getattr(getattr(d.backing, "port", None), "portgroupKey", None) == group.key]
        assert len(on_it) == 1 and on_it[0].backing.port.switchUuid == switch.uuid, name
        assert on_it[0].macAddress == drivers.driver_for(hosts[0]).private_mac(name, key)

    reservations.end(Reservation.objects.get(pk=head.pk), actor=alice)
    sync_jobs.drain()

    assert {r.status for r in machines(head).values()} == {"ended"}
    assert all(view.vm(r.vm.key) is None for r in rows.values())
    assert key not in [g.name for g in switch.portgroup]  # removed with the last machine
    for host in hosts:
        assert key not in HostView(si, drivers.driver_for(host)._host()).records()
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()
