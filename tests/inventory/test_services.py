"""Services: validation, change log, events, node states, delete hook, blade-center registration."""

import io

import pytest
from django.core.exceptions import ValidationError

from core import changelog, topics
from core.changelog import Actor
from core.models import Event, ObjectChange
from inventory import demo, services
from inventory.models import BladeCenter, Hypervisor, NodeGroup
from tests.inventory.conftest import TEST


def events_of(topic):
    return list(Event.objects.filter(topic=topic).order_by("id"))


# --- hypervisors ----------------------------------------------------------------------


def test_create_validates_everything_and_writes_nothing_when_invalid(db, chassis):
    with pytest.raises(ValidationError) as invalid:
        services.create_hypervisor(
            actor=TEST,
            name="bad name",
            address="10.0.0.300",
            driver="libvirt",
            uri="https://x/sdk",
            cpus=0,
            memory_mib=1,
            disk_gib=1,
            blade_center=chassis,
            slot=40,
        )
    errors = invalid.value.message_dict
    assert set(errors) >= {"name", "address", "uri", "cpus", "slot"}
    assert errors["slot"] == ["bc1 has slots 1–16, not 40"]
    assert not Hypervisor.objects.exists() and not ObjectChange.objects.filter(content_type__model="hypervisor")


def test_names_are_unique_ignoring_case(db, make_host):
    make_host(name="Node1")
    with pytest.raises(ValidationError, match="already exists"):
        make_host(name="node1")


def test_update_logs_the_difference_and_emits_to_host_chassis_and_admin(db, make_host, chassis, group):
    host = make_host(name="h1", blade_center=chassis, slot=1)
    services.update_hypervisor(
        host, actor=Actor.of("alice-bot"), cpus=64, group=group, slot=2, tags=["gpu"], reason="upgrade"
    )
    change = changelog.history(host)[0]
    assert change.action == "update" and change.reason == "upgrade" and change.actor == "alice-bot"
    assert change.changes == {"cpus": [16, 64], "group": [None, "lab"], "slot": [1, 2], "tags": [[], ["gpu"]]}
    event = events_of(f"bladecenter.{chassis.pk}")[-1]
    assert event.kind == "hypervisor.changed"
    assert {(s["slot"], s["id"]) for s in event.data["slots"]} == {(2, host.pk), (1, None)}
    assert events_of(f"hypervisor.{host.pk}")[-1].data["slot"] == 2
    assert events_of("admin")[-1].kind == "hypervisor.changed"


def test_moving_a_host_to_another_chassis_empties_its_old_slot_there(db, make_host, chassis):
    other = services.create_blade_center(actor=TEST, name="bc2", slot_count=8)
    host = make_host(name="mover", blade_center=chassis, slot=3)
    services.update_hypervisor(host, actor=TEST, blade_center=other, slot=5)
    assert events_of(f"bladecenter.{chassis.pk}")[-1].data["slots"] == [
        {"slot": 3, "id": None, "name": None, "state": None}
    ]
    assert events_of(f"bladecenter.{other.pk}")[-1].data["slots"] == [
        {"slot": 5, "id": host.pk, "name": "mover", "state": "online"}
    ]


def test_an_import_racing_another_writer_is_refused_cleanly(db, monkeypatch):
    from django.db import IntegrityError

    from core import bulk

    def clash(*args, **kwargs):
        raise IntegrityError("UNIQUE constraint failed")

    monkeypatch.setattr(bulk, "insert_instances", clash)
    data = b"name,address,cpus,memory_mib,disk_gib\nh1,10.0.0.1,1,1,1\n"
    report = services.import_hypervisors(data, "csv", actor=TEST)
    assert not report.ok and "did someone change these hosts meanwhile" in report.file_errors[0]
    assert not Hypervisor.objects.exists()


def test_an_update_that_changes_nothing_logs_nothing(db, make_host):
    host = make_host(name="h1", tags=["x"])
    count = ObjectChange.objects.count()
    services.update_hypervisor(host, actor=TEST, cpus=host.cpus, tags=["x"])
    assert ObjectChange.objects.count() == count


def test_state_changes_need_a_reason_and_are_logged_and_emitted(db, make_host, chassis):
    host = make_host(name="h1", blade_center=chassis, slot=7)
    with pytest.raises(ValidationError) as refused:
        services.set_state(host, "drained", "   ", actor=TEST)
    assert refused.value.message_dict == {"reason": ["required: say why the state changes"]}
    with pytest.raises(ValidationError, match="unknown state"):
        services.set_state(host, "broken", "x", actor=TEST)

    assert services.set_state(host, "drained", "evacuating", actor=Actor(name="job 12")) is True
    host.refresh_from_db()
    assert (host.state, host.state_reason, host.state_changed_by) == ("drained", "evacuating", "job 12")
    assert host.state_changed_at is not None
    change = changelog.history(host)[0]
    assert change.action == "state" and change.changes["state"] == ["online", "drained"]
    for topic in (f"hypervisor.{host.pk}", f"bladecenter.{chassis.pk}", "admin"):
        event = events_of(topic)[-1]
        assert event.kind == "hypervisor.state"
        assert event.data["state"] == "drained" and event.data["by"] == "job 12"
    assert events_of(f"bladecenter.{chassis.pk}")[-1].data["slots"] == [
        {"slot": 7, "id": host.pk, "name": "h1", "state": "drained"}
    ]
    assert services.set_state(host, "drained", "evacuating", actor=TEST) is False  # nothing new


def test_delete_asks_the_in_use_checkers(db, make_host, chassis):
    busy = make_host(name="busy", blade_center=chassis, slot=3)
    idle = make_host(name="idle")
    with services.IN_USE_CHECKERS.replaced(lambda hv: "3 VMs running" if hv.name == "busy" else None, lambda hv: None):
        with pytest.raises(services.InUse, match="hypervisor busy is in use: 3 VMs running"):
            services.delete_hypervisor(busy, actor=TEST)
        assert Hypervisor.objects.filter(pk=busy.pk).exists()
        idle_pk = idle.pk
        services.delete_hypervisor(idle, actor=TEST, reason="decommissioned")
    assert not Hypervisor.objects.filter(pk=idle_pk).exists()
    change = ObjectChange.objects.filter(object_id=str(idle_pk), content_type__model="hypervisor").first()
    assert (change.action, change.reason) == ("delete", "decommissioned")
    with services.IN_USE_CHECKERS.replaced():
        services.delete_hypervisor(busy, actor=TEST)
    assert events_of(f"bladecenter.{chassis.pk}")[-1].data["slots"] == [
        {"slot": 3, "id": None, "name": None, "state": None}
    ]


def test_groups_chassis_and_credentials_in_use_cannot_be_deleted(db, make_host, group, chassis, credential):
    make_host(group=group, blade_center=chassis, slot=1, credential=credential)
    for delete, obj in (
        (services.delete_node_group, group),
        (services.delete_blade_center, chassis),
        (services.delete_credential, credential),
    ):
        with pytest.raises(services.InUse):
            delete(obj, actor=TEST)


def test_a_chassis_cannot_shrink_below_an_occupied_slot(db, make_host, chassis):
    make_host(blade_center=chassis, slot=12)
    with pytest.raises(ValidationError, match="slot 12 is occupied"):
        services.update_blade_center(chassis, actor=TEST, slot_count=8)
    services.update_blade_center(chassis, actor=TEST, slot_count=12)
    assert BladeCenter.objects.get(pk=chassis.pk).slot_count == 12


def test_facts_and_derived_properties(db, make_host):
    host = make_host(
        driver="libvirt",
        cpus=10,
        reserved_cpus=2,
        cpu_ratio=4.0,
        memory_mib=1000,
        reserved_memory_mib=200,
        address="kvm1.example.org",
    )
    assert host.hypervisor_type == "kvm" and host.image_formats == ("qcow2", "raw")
    assert host.connection_uri == "qemu+ssh://root@kvm1.example.org/system"
    assert (host.usable_vcpus, host.usable_memory_mib) == (32.0, 800.0)
    sim = make_host(driver="sim")
    assert sim.hypervisor_type == "sim" and sim.image_formats is None
    services.report_facts(host, {"cpus": 10, "model": "EPYC"}, actor=TEST)
    host.refresh_from_db()
    assert host.facts["model"] == "EPYC" and host.facts_updated_at is not None


def test_topics_for_hosts_and_chassis_are_staff_only(db, admin_user, alice):
    for topic in ("hypervisor.5", "bladecenter.2"):
        assert topics.may_subscribe(admin_user, topic)
        assert not topics.may_subscribe(alice, topic)


# --- blade-center registration ----------------------------------------------------------

SPEC = {
    "name": "bc7",
    "slot_count": 16,
    "first_slot": 1,
    "last_slot": 16,
    "hostname_pattern": "bc7-s{slot:02d}",
    "first_address": "10.7.0.250",
    "driver": "libvirt",
    "uri_template": "qemu+ssh://root@{address}/system",
    "cpus": 48,
    "memory_mib": 262144,
    "disk_gib": 4000,
    "group": "lab",
    "tags": ["rack7", "gpu"],
}


def test_registration_preview_writes_nothing(db, group):
    counts = Event.objects.count(), ObjectChange.objects.count()
    registration = services.register_blade_center(SPEC, actor=TEST, dry_run=True)
    assert registration.report.ok and not registration.report.committed
    assert registration.blade_center.pk is None
    assert [h["name"] for h in registration.hosts][:2] == ["bc7-s01", "bc7-s02"]
    assert registration.hosts[-1]["address"] == "10.7.1.9"  # consecutive, across the octet
    assert registration.hosts[0]["uri"] == "qemu+ssh://root@10.7.0.250/system"
    assert not BladeCenter.objects.exists() and not Hypervisor.objects.exists()
    assert (Event.objects.count(), ObjectChange.objects.count()) == counts


def test_registration_creates_the_chassis_and_its_hosts_at_once(db, group):
    registration = services.register_blade_center({**SPEC, "first_slot": 3, "last_slot": 10}, actor=TEST)
    assert registration.report.committed
    chassis = BladeCenter.objects.get(name="bc7")
    hosts = list(chassis.hypervisors.order_by("slot"))
    assert [h.slot for h in hosts] == list(range(3, 11)) and hosts[0].name == "bc7-s03"
    assert {h.group.name for h in hosts} == {"lab"}
    assert sorted(t.name for t in hosts[0].tags.all()) == ["gpu", "rack7"]
    assert ObjectChange.objects.filter(reason="registration of blade center bc7").count() == 9
    assert [s["id"] is not None for s in services.chassis_slots(chassis)].count(True) == 8


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"hostname_pattern": "{slot.__class__}"}, "hostname_pattern", "unknown placeholder"),
        ({"hostname_pattern": "x{slot:zz}"}, "hostname_pattern", "cannot fill"),
        ({"uri_template": "qemu://{nope}/"}, "uri_template", "unknown placeholder {nope}"),
        ({"first_address": "10.0.0.x"}, "first_address", "must be an IP address"),
        ({"first_address": "255.255.255.250"}, "first_address", "room for one address per slot"),
        ({"last_slot": 17}, "last_slot", "within 1–16"),
        ({"cpus": -1}, "cpus", "must be a positive integer"),
        ({"group": "nope"}, "group", "no node group named 'nope'"),
        ({"driver": "xen"}, "driver", "unknown driver"),
        ({"name": "bad name"}, "name", "must be 1–100"),
    ],
)
def test_registration_refuses_a_bad_spec(db, group, change, field, message):
    with pytest.raises(ValidationError) as refused:
        services.register_blade_center({**SPEC, **change}, actor=TEST)
    assert message in " ".join(refused.value.message_dict[field])
    assert not BladeCenter.objects.exists()


def test_registration_with_a_rejected_row_creates_nothing(db, group, make_host):
    make_host(name="bc7-s05")
    registration = services.register_blade_center(SPEC, actor=TEST)
    assert not registration.report.ok and not registration.report.committed
    assert registration.report.messages() == [
        f"Row 5 name: a hypervisor named 'bc7-s05' already exists (id {Hypervisor.objects.get().pk})"
    ]
    assert not BladeCenter.objects.exists() and Hypervisor.objects.get().blade_center is None


def test_registration_refuses_an_existing_chassis_name(db, group, chassis):
    with pytest.raises(ValidationError, match="a blade center named 'bc1' already exists"):
        services.register_blade_center({**SPEC, "name": "bc1"}, actor=TEST)


def test_the_demo_step_registers_bc1_once(db):
    out = io.StringIO()
    demo.blade_center(out)
    demo.blade_center(out)
    assert "16 simulated hypervisors" in out.getvalue() and "already there" in out.getvalue()
    chassis = BladeCenter.objects.get(name="bc1")
    assert sorted(chassis.hypervisors.values_list("name", flat=True)) == [f"bc1-s{i:02d}" for i in range(1, 17)]
    assert set(chassis.hypervisors.values_list("driver", flat=True)) == {"sim"}
    assert NodeGroup.objects.filter(name="lab").count() == 1


def test_a_state_change_tells_the_registered_hooks_inside_its_transaction(db, make_host):
    host = make_host(name="maint")
    seen = []

    def hook(hv, old_state, *, actor):
        seen.append((hv.name, old_state, hv.state, Hypervisor.objects.get(pk=hv.pk).state))

    with services.ON_STATE_CHANGE.replaced(hook):
        services.set_state(host, "drained", "new disks", actor=TEST)
        services.set_state(host, "drained", "new disks", actor=TEST)  # nothing changed: no call
    assert seen == [("maint", "online", "drained", "drained")]

    def refuse(hv, old_state, *, actor):
        raise ValidationError({"state": ["the hook refused"]})

    with services.ON_STATE_CHANGE.replaced(refuse), pytest.raises(ValidationError):
        services.set_state(host, "offline", "power", actor=TEST)
    assert Hypervisor.objects.get(pk=host.pk).state == "drained"  # the hook's failure rolls the change back
