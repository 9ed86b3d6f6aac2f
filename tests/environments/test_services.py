"""What a template becomes (its machines, its gang) and who may change, share or delete it."""

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError

from core.changelog import history
from environments import services
from environments.models import EnvironmentTemplate
from placement import PlacementEngine
from placement.gang import place_gang
from provisioning import services as vms
from tests.environments.conftest import member
from tests.images import image_maintainer
from tests.placement.helpers import cluster, host

pytestmark = pytest.mark.django_db

START = datetime(2030, 1, 7, 9, tzinfo=UTC)
END = START + timedelta(hours=2)


def test_expand_names_each_machine_of_a_member_and_keeps_its_size_and_networks(netlab, debian):
    machines = {m.hostname: m for m in services.expand(netlab)}
    assert sorted(machines) == ["client-a", "client-b-1", "client-b-2", "router"]
    assert machines["client-b-2"].networks == ("right",) and machines["client-b-2"].member == "client-b"
    assert machines["router"].entry and machines["router"].networks == ("left", "right")
    assert [m.hostname for m in services.expand(netlab) if m.entry] == ["router"]
    assert machines["client-a"].image == debian and machines["client-a"].size == {
        "vcpus": 1,
        "memory_mib": 512,
        "disk_gib": 5,
    }


def test_one_network_of_three_is_one_set(make_template, alice, debian):
    members = [member("db", debian, "lan", count=2), member("app", debian, "lan", entry=True)]
    template = make_template(alice, members, [{"name": "lan"}])
    gang = services.gang_for(template, START, END, "r7:")
    assert gang.together == (frozenset({"r7:db-1", "r7:db-2", "r7:app"}),)


def test_two_networks_sharing_a_router_are_one_set(netlab):
    gang = services.gang_for(netlab, START, END, "r1:")
    assert gang.together == (frozenset({"r1:router", "r1:client-a", "r1:client-b-1", "r1:client-b-2"}),)


def test_two_disjoint_networks_are_two_sets(make_template, alice, debian):
    template = make_template(
        alice,
        [
            member("a1", debian, "one", entry=True),
            member("a2", debian, "one"),
            member("b", debian, "two", count=2),
        ],
        [{"name": "one"}, {"name": "two"}],
    )
    gang = services.gang_for(template, START, END, "x-")
    assert sorted(map(sorted, gang.together)) == [["x-a1", "x-a2"], ["x-b-1", "x-b-2"]]


def test_a_lone_member_is_in_no_set(make_template, alice, debian):
    template = make_template(alice, [member("solo", debian, entry=True)])
    gang = services.gang_for(template, START, END, "g:")
    assert gang.together == () and [m.id for m in gang.members] == ["g:solo"]


def test_each_request_is_the_one_a_reservation_of_that_image_and_size_gets(netlab, router_image):
    gang = services.gang_for(netlab, START, END, "r:")
    router = next(m for m in gang.members if m.id == "r:router")
    size = {"vcpus": 2, "memory_mib": 1024, "disk_gib": 2}
    alone = vms.demand_for(router_image, size, start=START, end=END, purpose="x")
    assert router == alone.request("r:router")
    assert gang.start == START.timestamp() and gang.end == END.timestamp()


def test_the_gang_places_the_connected_machines_on_one_host(netlab):
    engine = PlacementEngine(cluster(host("small", vcpus=2), host("big", vcpus=16)))
    gang = services.gang_for(netlab, START, END, "r:")
    # the placement core's own hosts run any hypervisor type: drop the sim image's for this check
    gang = dataclasses.replace(gang, members=tuple(dataclasses.replace(m, hypervisors=None) for m in gang.members))
    result = place_gang(engine, gang)
    assert result.ok and set(result.hosts.values()) == {"big"}


def test_only_the_owner_maintainers_of_its_groups_and_admins_change_it(netlab, alice, bob, admin_user):
    with pytest.raises(PermissionDenied):
        services.update_template(netlab, actor=bob, description="mine now")
    with pytest.raises(PermissionDenied):
        services.delete_template(netlab, actor=bob)
    services.update_template(netlab, actor=alice, description="Two LANs.")
    services.update_template(netlab, actor=admin_user, visibility="public")
    assert EnvironmentTemplate.objects.get(pk=netlab.pk).visibility == "public"
    assert [e.action for e in history(netlab)][:3] == ["update", "update", "create"]


def test_only_administrators_make_a_template_public(netlab, alice, debian, make_template):
    with pytest.raises(PermissionDenied):
        services.update_template(netlab, actor=alice, visibility="public")
    with pytest.raises(PermissionDenied):
        make_template(alice, [member("a", debian, entry=True)], visibility="public")


def test_an_update_replaces_the_members_and_keeps_the_networks(netlab, alice, debian):
    services.update_template(
        netlab,
        actor=alice,
        members=[member("gw", debian, "left", entry=True), member("pc", debian, "left")],
    )
    assert sorted(netlab.members.values_list("name", flat=True)) == ["gw", "pc"]
    assert sorted(netlab.networks.values_list("name", flat=True)) == ["left", "right"]


def test_an_update_that_breaks_a_rule_changes_nothing(netlab, alice, debian):
    with pytest.raises(ValidationError):
        services.update_template(netlab, actor=alice, description="x", members=[member("gw", debian, "left")])
    netlab.refresh_from_db()
    assert netlab.description.startswith("A router") and netlab.members.count() == 3


def test_a_maintainer_shares_it_with_their_group_and_its_members_see_it(netlab, alice, bob):
    lab = Group.objects.create(name="lab")
    maya = image_maintainer(lab)
    alice.groups.add(lab)
    assert not services.visible_templates(bob).filter(pk=netlab.pk).exists()
    with pytest.raises(PermissionDenied):
        services.share_template(netlab, [lab], actor=alice)  # an owner does not share, as with images
    with pytest.raises(PermissionDenied):
        services.share_template(netlab, [Group.objects.create(name="other")], actor=maya)
    services.share_template(netlab, [lab], actor=maya)
    bob.groups.add(lab)
    assert services.visible_templates(bob).filter(pk=netlab.pk).exists()
    services.update_template(netlab, actor=maya, description="maintained")  # now one of her groups'


def test_a_stranger_does_not_see_a_private_template_and_staff_see_all(netlab, alice, bob, admin_user):
    assert list(services.visible_templates(alice)) == [netlab]
    assert list(services.visible_templates(bob)) == []
    assert list(services.visible_templates(admin_user)) == [netlab]


def test_the_owner_deletes_it_and_each_change_is_an_event(netlab, alice):
    from core import events

    pk = netlab.pk
    services.update_template(netlab, actor=alice, description="Two LANs.")
    services.delete_template(netlab, actor=alice)
    assert not EnvironmentTemplate.objects.exists()
    seen = [(e.kind, e.data["id"]) for e in events.since(["admin"], 0) if e.kind.startswith("environment.")]
    assert seen == [("environment.created", pk), ("environment.updated", pk), ("environment.deleted", pk)]


def test_a_pinned_revision_runs_where_that_revision_has_disks(make_template, admin_user, debian):
    kvm = {"hypervisor_type": "kvm", "format": "qcow2", "size_gib": 2, "location": "/srv/images/debian-12-2.qcow2"}
    revision = vms.add_revision(debian, actor="test", variants=[kvm])
    template = make_template(admin_user, [member("a", debian, entry=True, revision=revision.number)])
    (request,) = services.gang_for(template, START, END).members
    size = {"vcpus": 1, "memory_mib": 512, "disk_gib": 5}
    pinned = vms.demand_for(debian, size, start=START, end=END, purpose="x", hypervisors={"kvm"}).request("a")
    production = vms.demand_for(debian, size, start=START, end=END, purpose="x").request("a")
    assert request.hypervisors == pinned.hypervisors != production.hypervisors
    assert services.expand(template)[0].revision == revision


def test_an_image_a_template_uses_cannot_be_deleted(netlab, debian):
    from core.errors import InUse

    with pytest.raises(InUse, match="debian-12 is used by 2 members"):
        vms.delete_image(debian, actor="test")


def test_a_group_that_gives_a_role_is_no_audience(netlab, admin_user):
    from accounts import access

    with pytest.raises(ValidationError, match="gives a role, not an audience"):
        services.share_template(netlab, [access.role_group("operator")], actor=admin_user)
    assert not netlab.groups.exists()
