"""How the user reaches each machine of an environment: from the entry machine, by name and
private address on each of its networks, and directly where its host gave it a login address
of its own, as the entry machine's; on the API and the reservation's page."""

from datetime import timedelta

from drivers.sim.models import SimNIC
from provisioning.models import VM
from reservations import services
from tests.environments.conftest import debian, make_template, member, router_image  # noqa: F401 (fixtures)
from tests.reservations.test_environments import lab  # noqa: F401 (fixture)

H = timedelta(hours=1)


def test_each_machine_says_how_it_is_reached(make_host, lab, alice, bob, api, client, sync_jobs):  # noqa: F811
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    body = api(alice).get(f"/api/v1/reservations/{head.pk}/").json()
    reach = {m["hostname"]: m["reach"] for m in body["machines"]}
    # Each machine's fixed address on each of its networks: the one its guest got there.
    got, hostnames = {}, {vm.key: vm.hostname for vm in VM.objects.all()}
    for nic in SimNIC.objects.select_related("vm", "network"):
        hostname = hostnames[nic.vm.key]
        got.setdefault(hostname, []).append({"network": nic.network.key.split("-", 1)[1], "address": nic.address})
    for name, way in reach.items():
        assert [{"network": w["network"], "address": w["address"]} for w in way["from_entry"]] == sorted(
            got[name], key=lambda w: w["network"]
        )
        assert all(w["name"] == name and w["shared_with_entry"] for w in way["from_entry"])
    assert [w["network"] for w in reach["router"]["from_entry"]] == ["left", "right"]
    # The simulated host gives each guest an address of its own: each is reachable directly,
    # with the environment's one login, and no password in it.
    machines = {m["hostname"]: m for m in body["machines"]}
    for name, way in reach.items():
        assert way["direct"]["address"] == machines[name]["address"] and "password" not in way["direct"]
        assert way["direct"]["command"].endswith(f"@{machines[name]['address']}")
    assert body["connection"]["user"] == reach["client"]["direct"]["user"]

    client.force_login(alice)
    page = client.get(f"/reservations/{head.pk}/").content.decode()
    assert "From the entry machine" in page and "192.168.20.3" in page and reach["server"]["direct"]["command"] in page


def test_a_machine_not_ready_is_reached_from_the_entry_only(make_host, lab, alice, api):  # noqa: F811
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)  # (not built yet)
    body = api(alice).get(f"/api/v1/reservations/{head.pk}/").json()
    assert all(m["reach"]["direct"] is None for m in body["machines"])
    assert {m["hostname"]: len(m["reach"]["from_entry"]) for m in body["machines"]} == {
        "router": 2,
        "client": 1,
        "server": 1,
    }
