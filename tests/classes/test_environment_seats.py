"""A class whose seats are environments: each seat is every machine of the template, placed
all or nothing on the simulator; a seat that does not fit refuses the class whole."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.models import Allocation
from classes import services
from classes.models import Class, Meeting
from environments import services as environment_services
from provisioning.models import PrivateNetwork
from reservations import schedule
from reservations import services as reservations
from reservations.models import BlockAllocation, Reservation
from tests.environments.conftest import member

pytestmark = pytest.mark.django_db

H = timedelta(hours=1)


@pytest.fixture
def lab(instructor, image):
    """Three machines of 256 MiB on one network: 768 MiB a seat, on one host."""
    small = {"vcpus": 1, "memory_mib": 256, "disk_gib": 1}
    return environment_services.create_template(
        actor=instructor,
        name="three-node",
        members=[member("db-1", image, "lan", entry=True, **small), member("db-2", image, "lan", **small),
                 member("db-3", image, "lan", **small)],
        networks=[{"name": "lan", "cidr": "192.168.30.0/24"}],
    )  # fmt: skip


def make(course, image, term, by, **more):
    return services.create_class(actor=by, by=by, course=course, name="Databases", image=image, **term, **more)


def test_thirty_seats_of_three_machines_are_placed_whole_and_the_one_without_room_refuses_it(
    make_host, image, lab, course, instructor, term
):
    for n in range(29):  # room for 29 seats, one a host (each seat's machines share a network)
        make_host(f"node{n:02d}", cpus=4, memory_mib=768, disk_gib=10)
    term = {**term, "last_day": term["first_day"]}  # one session
    with pytest.raises(ValidationError) as refused:
        make(course, image, term, instructor, seats=30, environment=lab)
    [message] = refused.value.message_dict["sessions"]
    assert "seat 30 of 30 does not fit" in message and "must share a host" in message
    assert not Class.objects.exists() and not BlockAllocation.objects.exists()
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    assert not PrivateNetwork.objects.exists()

    klass = make(course, image, term, instructor, seats=29, environment=lab)
    [meeting] = Meeting.objects.filter(klass=klass)
    heads = Reservation.objects.filter(block=meeting.block, head__isnull=True)
    assert heads.count() == 29 and Reservation.objects.filter(block=meeting.block).count() == 87
    for head in heads:
        hosts = {r.allocation.host_id for r in Reservation.objects.filter(head=head)} | {head.allocation.host_id}
        assert len(hosts) == 1
    assert Allocation.objects.filter(released__isnull=True).count() == 87


def test_seats_are_built_whole_before_the_session_and_a_student_gets_the_entry_machine(
    make_host, image, lab, course, instructor, student, term, sync_jobs
):
    make_host("big", cpus=16, memory_mib=8192)
    term = {**term, "last_day": term["first_day"]}
    klass = make(course, image, term, instructor, seats=2, environment=lab)
    [meeting] = Meeting.objects.filter(klass=klass)
    assert services.plan_round(meeting.start - timedelta(minutes=14))["built"] == 6  # every machine of both seats
    sync_jobs.drain()
    rows = Reservation.objects.filter(block=meeting.block)
    assert set(rows.values_list("status", flat=True)) == {"ready"}
    found, seat = services.next_seat(student, klass, now=meeting.start)
    assert found == meeting and seat.head_id is None and seat.hostname == "db-1"
    assert set(Reservation.objects.filter(head=seat).values_list("user", flat=True)) == {student.pk}
    assert services.seat_counts(meeting)["ready"] == 2  # seats, not machines

    schedule.tick(now=meeting.end + timedelta(minutes=1))
    sync_jobs.drain()
    assert set(rows.values_list("status", flat=True)) == {"ended"}
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()


def test_the_api_and_the_course_page_take_an_environment(
    api, client, make_host, image, lab, course, instructor, rival, term
):
    from tests.classes.test_pages_api_cli import api_body

    make_host("big", cpus=16, memory_mib=8192)
    hidden = api(rival).post("/api/v1/classes/", api_body(course, image, term, environment=lab.pk), format="json")
    assert hidden.status_code in (400, 403, 404)  # not rival's course, nor rival's template
    made = api(instructor).post("/api/v1/classes/", api_body(course, image, term, environment=lab.pk), format="json")
    assert made.status_code == 201, made.content
    assert made.data["environment"] == lab.pk
    meeting = Meeting.objects.get(klass_id=made.data["id"])
    assert (
        Reservation.objects.filter(block=meeting.block).count()
        == 3 * Reservation.objects.filter(block=meeting.block, head__isnull=True).count()
    )
    client.force_login(instructor)
    page = client.get(f"/classes/{course.pk}/classes/{made.data['id']}/").content.decode()
    assert 'name="environment"' in page and f'<option value="{lab.pk}" selected>' in page


def test_an_environment_of_the_class_image_counts_against_the_hours_budget_once(
    make_host, image, course, instructor, student
):
    from tests.classes.test_budget import make as make_budget_class

    make_host("big", cpus=16, memory_mib=8192)
    make_budget_class(course, image, instructor)  # 3 hours outside sessions
    small = {"vcpus": 1, "memory_mib": 256, "disk_gib": 1}
    pair = environment_services.create_template(
        actor=student,
        name="my-pair",
        members=[member("a", image, "lan", entry=True, **small), member("b", image, "lan", **small)],
        networks=[{"name": "lan", "cidr": "192.168.31.0/24"}],
    )
    with pytest.raises(ValidationError, match="3-hour budget for Networks lab; this asks for 4 hours"):
        reservations.reserve_environment(student, pair, actor=student, duration=timedelta(hours=4))
    assert not Reservation.objects.filter(environment=pair).exists()
    head = reservations.reserve_environment(student, pair, actor=student, duration=timedelta(hours=2))
    # Two machines of the class image, one environment: 2 of the 3 hours, not 4.
    with pytest.raises(ValidationError, match="1 hour left of your 3-hour budget"):
        reservations.reserve_environment(student, pair, actor=student, duration=timedelta(hours=2))
    assert Reservation.objects.filter(environment=pair, head__isnull=True).get() == head


@pytest.fixture
def gated_lab(instructor, image):
    """A database lab whose entry machine's image is free to use and whose second machine's
    image requires approval."""
    from provisioning import services as vms
    from tests.images import sim_image

    licensed = sim_image("oracle-db", os="Oracle Linux", min_memory_mib=256)
    vms.update_image(licensed, actor="test", requires_approval=True)
    small = {"vcpus": 1, "memory_mib": 256, "disk_gib": 1}
    return environment_services.create_template(
        actor=instructor,
        name="licensed-pair",
        members=[member("client", image, "lan", entry=True, **small), member("db", licensed, "lan", **small)],
        networks=[{"name": "lan", "cidr": "192.168.32.0/24"}],
    )


def test_a_class_waits_for_approval_when_a_machine_other_than_the_entry_needs_it(
    make_host, image, gated_lab, course, instructor, term
):
    from reservations.models import ApprovalRequest

    make_host("big", cpus=16, memory_mib=8192)
    asked = make(course, image, term, instructor, seats=1, environment=gated_lab)
    assert isinstance(asked, ApprovalRequest) and asked.payload["environment"] == gated_lab.pk
    assert not Class.objects.exists() and not Reservation.objects.exists()


def test_a_block_of_an_environment_with_a_gated_machine_is_an_administrators(
    make_host, image, gated_lab, course, instructor, admin_user
):
    make_host("big", cpus=16, memory_mib=8192)
    start = timezone.now() + timedelta(days=1)
    block = {"name": "db lab", "image": image, "group": course, "seats": 1, "start": start, "end": start + H}
    with pytest.raises(ValidationError) as refused:
        reservations.create_block(actor=instructor, created_by=instructor, environment=gated_lab, **block)
    assert refused.value.message_dict["environment"] == [
        "oracle-db needs an approver's approval: an administrator makes its blocks"
    ]
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    made = reservations.create_block(actor=admin_user, created_by=admin_user, environment=gated_lab, **block)
    assert Reservation.objects.filter(block=made).count() == 2
