"""A template's rules: each broken one is refused with words that name it, before anything is written."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from environments import rules, services
from environments.models import EnvironmentTemplate
from provisioning import services as vms
from tests import images
from tests.environments.conftest import member

pytestmark = pytest.mark.django_db
LAN = {"name": "lan", "cidr": ""}


def refusal(make_template, owner, members, networks=()):
    with pytest.raises(ValidationError) as caught:
        make_template(owner, members, networks)
    assert not EnvironmentTemplate.objects.exists()
    return " | ".join(m for ms in caught.value.message_dict.values() for m in ms)


def test_it_fills_sizes_from_the_image_and_picks_a_free_range(alice, debian, router_image, netlab):
    router = netlab.members.get(name="router")
    assert (router.vcpus, router.memory_mib, router.disk_gib) == (2, 1024, 2)
    client = netlab.members.get(name="client-a")
    assert (client.vcpus, client.memory_mib, client.disk_gib) == (1, 512, 5)
    assert netlab.networks.get(name="right").cidr == "192.168.0.0/24"  # the first /24 clear of left's


def test_it_rejects_a_template_without_an_entry(make_template, alice, debian):
    words = refusal(make_template, alice, [member("a", debian, "lan"), member("b", debian, "lan")], [{"name": "lan"}])
    assert "no member is the entry point" in words


def test_it_rejects_two_entries_and_an_entry_of_several(make_template, alice, debian):
    words = refusal(
        make_template,
        alice,
        [member("a", debian, "lan", entry=True), member("b", debian, "lan", entry=True, count=2)],
        [{"name": "lan"}],
    )
    assert "2 entry points (a, b)" in words and "member b: the entry point is one machine" in words


def test_it_rejects_a_member_on_no_network_among_several(make_template, alice, debian):
    members = [member("a", debian, "lan", entry=True), member("b", debian)]
    words = refusal(make_template, alice, members, [{"name": "lan"}])
    assert "member b is on no network" in words


def test_a_lone_member_needs_no_network(make_template, alice, debian):
    template = make_template(alice, [member("solo", debian, entry=True)])
    assert template.members.get().networks.count() == 0


def test_it_rejects_overlapping_ranges(make_template, alice, debian):
    words = refusal(
        make_template,
        alice,
        [member("a", debian, "one", "two", entry=True)],
        [{"name": "one", "cidr": "10.1.0.0/16"}, {"name": "two", "cidr": "10.1.2.0/24"}],
    )
    assert "networks one (10.1.0.0/16) and two (10.1.2.0/24) overlap" in words


def test_it_rejects_more_machines_than_a_range_holds(make_template, alice, debian):
    words = refusal(
        make_template,
        alice,
        [member("gw", debian, "tiny", entry=True), member("node", debian, "tiny", count=5)],
        [{"name": "tiny", "cidr": "192.168.5.0/29"}],
    )
    assert "network tiny (192.168.5.0/29) holds 5 machines; 6 are attached" in words


@pytest.mark.parametrize(
    ("cidr", "words"),
    [
        ("8.8.8.0/24", "is not private"),
        ("10.0.0.0/8", "prefix must be /16 to /29"),
        ("192.168.1.0/30", "prefix must be /16 to /29"),
        ("192.168.1.1/24", "host bits clear"),
        ("banana", "is not an IPv4 range"),
    ],
)
def test_it_rejects_a_range_that_is_not_a_private_one_of_the_allowed_sizes(make_template, alice, debian, cidr, words):
    members = [member("a", debian, "lan", entry=True)]
    assert words in refusal(make_template, alice, members, [{"name": "lan", "cidr": cidr}])


def test_it_rejects_an_image_the_owner_may_not_use(make_template, alice, bob, debian):
    private = vms.create_image(actor="test", name="bobs", visibility="restricted", owner=bob)
    words = refusal(make_template, alice, [member("a", private, entry=True)])
    assert "member a: no such image, or its owner may not use it" in words


def test_it_rejects_bad_and_repeated_hostnames(make_template, alice, debian):
    words = refusal(
        make_template,
        alice,
        [
            member("Web_1", debian, "lan", entry=True),
            member("db", debian, "lan", count=2),
            member("db-1", debian, "lan"),
            member("db-1", debian, "lan"),
        ],
        [{"name": "lan"}],
    )
    assert "member 'Web_1': a hostname" in words
    assert "two members are named db-1" in words
    assert "hostname db-1 is made by both member db and db-1" in words


def test_it_rejects_a_size_below_the_image_minimum_or_above_the_bounds(make_template, alice, debian):
    words = refusal(make_template, alice, [member("a", debian, entry=True, memory_mib=128, vcpus=5000)])
    assert "member a: memory_mib must be 256 to" in words and "member a: vcpus must be 1 to 1024" in words


def test_it_rejects_a_network_a_member_names_but_the_template_lacks(make_template, alice, debian):
    assert "member a: no network named wan" in refusal(make_template, alice, [member("a", debian, "wan", entry=True)])


def test_a_picked_range_is_large_enough_for_its_machines():
    assert str(rules.pick(300, [])) == "10.0.0.0/23"
    assert str(rules.pick(3, [rules._range("192.168.0.0/24")])) == "192.168.1.0/24"


def revision_under_test(image):
    kvm = {"hypervisor_type": "kvm", "format": "qcow2", "size_gib": 2, "location": f"/srv/images/{image.name}-2.qcow2"}
    return vms.add_revision(image, actor="test", comment="under test", variants=[kvm])


def test_only_a_maintainer_of_the_image_pins_a_revision_under_test(make_template, alice, debian):
    from django.contrib.auth.models import Group

    from tests.images import image_maintainer

    revision = revision_under_test(debian)
    words = refusal(make_template, alice, [member("a", debian, entry=True, revision=revision.number)])
    assert "member a: only a maintainer of debian-12 pins a revision under test" in words
    lab = Group.objects.create(name="lab")
    vms.update_image(debian, actor="test", groups=[lab])
    template = make_template(image_maintainer(lab), [member("a", debian, entry=True, revision=revision.number)])
    assert template.members.get().revision == revision


def test_it_rejects_a_retired_or_unknown_revision_and_keeps_production_by_default(make_template, admin_user, debian):
    from provisioning import revisions

    revision = revision_under_test(debian)
    revisions.retire(revision, actor="test")
    words = refusal(make_template, admin_user, [member("a", debian, entry=True, revision=revision.number)])
    assert f"member a: revision {revision.number} of debian-12 is retired" in words
    words = refusal(make_template, admin_user, [member("a", debian, entry=True, revision=99)])
    assert "member a: image debian-12 has no revision 99" in words
    assert make_template(admin_user, [member("a", debian, entry=True)]).members.get().revision is None


def test_it_rejects_an_image_with_no_disk_to_build_from(make_template, alice):
    bare = vms.create_image(actor="test", name="bare")
    words = refusal(make_template, alice, [member("a", bare, entry=True)])
    assert "member a: image bare has no variant for any hypervisor" in words


def test_it_rejects_machines_that_share_a_host_and_an_anti_affinity_group(make_template, alice, debian):
    db = images.sim_image("postgres", anti_affinity="db")
    with pytest.raises(ValidationError, match="at most one such machine per joined set"):
        make_template(alice, [member("gw", debian, "lan", entry=True), member("db", db, "lan", count=2)], [LAN])
    other = images.sim_image("mariadb", anti_affinity="other-db")
    with pytest.raises(ValidationError, match="anti-affinity"):
        make_template(
            alice, [member("gw", debian, "lan", entry=True), member("a", db, "lan"), member("b", other, "lan")], [LAN]
        )


def test_one_machine_of_an_anti_affinity_group_per_joined_set_makes_a_gang(make_template, alice, debian):
    db = images.sim_image("postgres", anti_affinity="db")
    template = make_template(
        alice,
        [member("gw", debian, "left", entry=True), member("db-a", db, "left"), member("db-b", db, "right")],
        [{"name": "left", "cidr": ""}, {"name": "right", "cidr": ""}],
    )
    start = datetime(2030, 1, 1, tzinfo=UTC)
    gang = services.gang_for(template, start, start + timedelta(hours=1))
    assert {m.id: m.anti_affinity for m in gang.members} == {"gw": None, "db-a": "db", "db-b": "db"}


def test_it_rejects_more_machines_in_all_than_the_site_allows(make_template, alice, debian, settings):
    settings.ENVIRONMENT_MAX_MACHINES = 6
    members = [member("gw", debian, "lan", entry=True), member("node", debian, "lan", count=4)]
    make_template(alice, members, [LAN])  # 5: within the cap
    members = [member("gw", debian, "lan", entry=True), member("node", debian, "lan", count=3),
               member("db", debian, "lan", count=3)]  # fmt: skip
    words = refusal_of(make_template, alice, members, [LAN])
    assert words == "members: 7 machines in all; a template holds at most 6 (ENVIRONMENT_MAX_MACHINES)"


def test_the_cap_is_sixteen_machines_by_default(make_template, alice, debian):
    members = [member("gw", debian, "lan", entry=True), member("node", debian, "lan", count=16)]
    assert "17 machines in all; a template holds at most 16" in refusal(make_template, alice, members, [LAN])


def refusal_of(make_template, owner, members, networks):
    with pytest.raises(ValidationError) as caught:
        make_template(owner, members, networks)
    return " | ".join(f"{k}: {m}" for k, ms in caught.value.message_dict.items() for m in ms)
