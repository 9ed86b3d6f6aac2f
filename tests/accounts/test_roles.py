"""The roles, as one generic suite: for each role and each class of endpoint — pages, the REST
API, opcodes (job submission through jobs' API) and websocket topics — one action
the role may do and one it may not; a refused action changes nothing.

Personas: ``instructor`` (teaches cs101), ``maintainer`` (maintains cs101's images), ``operator``,
``auditor``, ``admin`` and ``user`` (no role). ``other`` is a plain user with data of their own.
Administrators and auditors are refused no topic by design (they read everything), so their
refused topic is one nobody may read.
"""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from accounts import access
from core import topics
from inventory.models import Hypervisor, NodeGroup
from jobs.models import Job
from provisioning.models import Image
from reservations import services as reservations
from reservations.models import BlockAllocation, Reservation
from tests.images import sim_image

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


class World:
    """The data every case acts on, made once per test."""

    def __init__(self, make_host, users):
        self.users = users
        self.host = make_host("node-a", driver="sim", cpus=16, memory_mib=32768, disk_gib=500)
        self.cs101, self.cs102 = Group.objects.create(name="cs101"), Group.objects.create(name="cs102")
        for name in ("amy", "instructor", "maintainer"):  # amy (a student) takes the block's seat
            users[name].groups.add(self.cs101)
        users["other"].groups.add(self.cs102)
        self.image = self._image("debian", [])
        self.ours = self._image("cs101-matlab", [self.cs101])
        self.theirs = self._image("cs102-rstudio", [self.cs102])
        self.start = timezone.now() + 24 * H
        self.block = reservations.create_block(
            actor="test",
            name="CS101",
            image=self.image,
            group=self.cs101,
            seats=1,
            start=self.start,
            end=self.start + H,
            created_by=users["admin"],
        )
        self.seat = Reservation.objects.get(block=self.block)

    @staticmethod
    def _image(name, groups):
        return sim_image(
            name, location=f"sim://{name}", size_gib=1, groups=groups, min_memory_mib=256, default_memory_mib=512
        )

    def block_body(self, group):
        start = self.start + 48 * H
        return {
            "name": f"for {group}",
            "image": self.image.pk,
            "group": group,
            "seats": 1,
            "start": start.isoformat(),
            "end": (start + H).isoformat(),
            "weeks": 1,
        }

    def state(self):
        """What a refused action must leave as it was."""
        return {
            "host": Hypervisor.objects.get(pk=self.host.pk).state,
            "node_groups": NodeGroup.objects.count(),
            "blocks": BlockAllocation.objects.count(),
            "images": list(Image.objects.order_by("pk").values_list("name", "description", "active")),
            "jobs": Job.objects.count(),
        }


@pytest.fixture
def world(make_host, django_user_model):
    access.ensure_roles()
    make = django_user_model.objects.create_user
    users = {
        "admin": make("root", is_staff=True, is_superuser=True),
        "user": make("ursula"),
        "other": make("otto"),
        "amy": make("amy"),
    }
    for persona, role in [
        ("instructor", "instructor"),
        ("maintainer", "image-maintainer"),
        ("operator", "operator"),
        ("auditor", "auditor"),
    ]:
        users[persona] = make(persona)
        access.set_roles(users[persona], [role], actor="test")
    return World(make_host, users)


def page(world, persona):
    client = Client()
    client.force_login(world.users[persona])
    return client


# --- pages: (persona, allowed?) → an action returning (response, what proves it was done) -------


def drain_host_page(world, persona):
    response = page(world, persona).post(
        f"/inventory/hypervisors/{world.host.pk}/state/", {"state": "drained", "reason": "maintenance"}
    )
    return response.status_code == 302 and Hypervisor.objects.get(pk=world.host.pk).state == "drained"


def read_inventory_page(world, persona):
    return page(world, persona).get("/inventory/").status_code == 200


def usage_page(world, persona):
    return page(world, persona).get("/reservations/usage/").status_code == 200


def block_page(world, persona, group):
    body = {**world.block_body(group.pk), "start": "", "end": ""}
    start = world.start + 48 * H
    body.update(start=start.strftime("%Y-%m-%dT%H:%M"), end=(start + H).strftime("%Y-%m-%dT%H:%M"))
    before = BlockAllocation.objects.count()
    response = page(world, persona).post("/reservations/blocks/", body)
    return response.status_code == 302 and BlockAllocation.objects.count() == before + 1


def edit_image_page(world, persona, image):
    client = page(world, persona)
    form = client.get(f"/vms/images/{image.pk}/edit/")
    if form.status_code != 200:
        return False
    values = {field.name: field.value() for field in form.context["form"] if field.value() is not None}
    values["groups"] = [g.pk for g in image.groups.all()]
    values["description"] = "edited"
    for name in ("required_tags", "forbidden_tags"):
        values.pop(name, None)
    response = client.post(f"/vms/images/{image.pk}/edit/", values)
    return response.status_code == 302 and Image.objects.get(pk=image.pk).description == "edited"


PAGES = {
    "admin": (drain_host_page, None),
    "operator": (drain_host_page, usage_page),
    "auditor": (read_inventory_page, drain_host_page),
    "instructor": (lambda w, p: block_page(w, p, w.cs101), lambda w, p: block_page(w, p, w.cs102)),
    "maintainer": (lambda w, p: edit_image_page(w, p, w.ours), lambda w, p: edit_image_page(w, p, w.theirs)),
    "user": (lambda w, p: page(w, p).get("/reservations/").status_code == 200, read_inventory_page),
}


# --- the API, with a token carrying every scope the persona's roles allow ---------------------


def node_group_api(world, persona, api):
    response = api(world.users[persona]).post("/api/v1/node-groups/", {"name": "rack-9"}, format="json")
    return response.status_code == 201


def read_hosts_api(world, persona, api):
    return api(world.users[persona]).get("/api/v1/hypervisors/").status_code == 200


def usage_api(world, persona, api):
    return api(world.users[persona]).get("/api/v1/usage/").status_code == 200


def block_api(world, persona, api, group):
    body = world.block_body(group)
    return api(world.users[persona]).post("/api/v1/block-allocations/", body, format="json").status_code == 201


def image_api(world, persona, api, image):
    response = api(world.users[persona]).patch(f"/api/v1/images/{image.pk}/", {"active": False}, format="json")
    return response.status_code == 200 and not Image.objects.get(pk=image.pk).active


API = {
    "admin": (node_group_api, None),
    "operator": (node_group_api, usage_api),
    "auditor": (usage_api, node_group_api),
    "instructor": (lambda w, p, a: block_api(w, p, a, "cs101"), lambda w, p, a: block_api(w, p, a, "cs102")),
    "maintainer": (lambda w, p, a: image_api(w, p, a, w.ours), lambda w, p, a: image_api(w, p, a, w.theirs)),
    "user": (lambda w, p, a: a(w.users[p]).get("/api/v1/images/").status_code == 200, read_hosts_api),
}


# --- opcodes: submitted through the jobs API ------------------------------------------------


def submit(opcode, params=None):
    def act(world, persona, api):
        body = {"opcode": opcode, "params": params(world) if params else {}}
        return api(world.users[persona]).post("/api/v1/jobs/", body, format="json").status_code == 202

    return act


REFRESH = submit("hypervisor.refresh", lambda w: {"hypervisor": w.host.pk})
NOOP = submit("noop")
OPCODES = {
    "admin": (REFRESH, None),
    "operator": (REFRESH, submit("repair.drift", lambda w: {"vm": 1})),  # repairs are the admins'
    "auditor": (NOOP, REFRESH),
    "instructor": (NOOP, REFRESH),
    "maintainer": (NOOP, REFRESH),
    "user": (NOOP, REFRESH),
}


# --- websocket topics: the authoriser the consumer (and the events API) asks ---------------------


def topic(name):
    def act(world, persona):
        return topics.may_subscribe(world.users[persona], name(world) if callable(name) else name)

    return act


NOBODYS = topic("nosuchprefix.1")
TOPICS = {
    "admin": (topic(lambda w: f"user.{w.users['other'].pk}"), NOBODYS),
    "operator": (topic(lambda w: f"hypervisor.{w.host.pk}"), topic(lambda w: f"user.{w.users['other'].pk}")),
    "auditor": (topic(lambda w: f"user.{w.users['other'].pk}"), NOBODYS),
    "instructor": (topic(lambda w: f"reservation.{w.seat.pk}"), topic(lambda w: f"hypervisor.{w.host.pk}")),
    "maintainer": (topic(lambda w: f"user.{w.users['maintainer'].pk}"), topic("admin")),
    "user": (topic(lambda w: f"user.{w.users['user'].pk}"), topic(lambda w: f"reservation.{w.seat.pk}")),
}

TABLES = {"page": PAGES, "api": API, "opcode": OPCODES, "topic": TOPICS}
# Administrators are refused no page, API route or opcode (token scopes are tested apart).
CASES = [
    pytest.param(kind, persona, allowed, id=f"{kind}-{persona}-{'allowed' if allowed else 'refused'}")
    for kind, table in TABLES.items()
    for persona, actions in table.items()
    for allowed, action in zip((True, False), actions, strict=True)
    if action is not None
]


@pytest.mark.parametrize("kind,persona,allowed", CASES)
def test_each_role_on_each_class_of_endpoint(world, api, kind, persona, allowed):
    action = TABLES[kind][persona][0 if allowed else 1]
    args = (world, persona, api) if kind in ("api", "opcode") else (world, persona)
    before = world.state()
    done = action(*args)
    assert done is allowed, f"{persona} {'could not' if allowed else 'could'} do the {kind} action"
    if not allowed:
        assert world.state() == before, "a refused action changed something"


def test_an_instructor_acting_on_a_group_not_theirs_is_refused_everywhere(world, api, caplog):
    instructor = world.users["instructor"]
    theirs = reservations.create_block(
        actor="test",
        name="CS102",
        image=world.image,
        group=world.cs102,
        seats=1,
        start=world.start + 72 * H,
        end=world.start + 73 * H,
        created_by=world.users["admin"],
    )
    before = world.state()

    assert (
        api(instructor).post("/api/v1/block-allocations/", world.block_body("cs102"), format="json").status_code == 403
    )
    assert api(instructor).post(f"/api/v1/block-allocations/{theirs.pk}/cancel/").status_code == 404
    assert page(world, "instructor").post(f"/reservations/blocks/{theirs.pk}/cancel/").status_code == 404
    assert not block_page(world, "instructor", world.cs102)
    seat = Reservation.objects.get(block=theirs)
    assert api(instructor).get(f"/api/v1/reservations/{seat.pk}/").status_code == 404
    assert not topics.may_subscribe(instructor, f"reservation.{seat.pk}")

    assert world.state() == before and not BlockAllocation.objects.get(pk=theirs.pk).canceled
    assert "not one of their groups" in caplog.text


def test_it_refuses_an_instructor_blocks_for_a_role_group(world, api, caplog):
    """The ``instructor`` group holds every instructor, and ``faculty`` (a directory group given
    the permission) every teacher: a role, not a class. Being in one is no licence to book its
    members' weeks or see their reservations."""
    from django.contrib.auth.models import Permission

    instructor = world.users["instructor"]
    faculty = Group.objects.create(name="faculty")
    faculty.permissions.add(Permission.objects.get(codename="teach", content_type__app_label="accounts"))
    instructor.groups.add(faculty)
    role_group = access.role_group("instructor")
    assert list(access.teaching_groups(instructor)) == [world.cs101]
    assert list(reservations.teaching_groups(instructor)) == [world.cs101]
    before = world.state()

    for group in (role_group, faculty):
        response = api(instructor).post("/api/v1/block-allocations/", world.block_body(group.name), format="json")
        assert response.status_code == 403, response.content
        assert not block_page(world, "instructor", group)
    assert world.state() == before
    assert "not one of their groups" in caplog.text
    # A block an administrator made for the role group is not theirs to cancel or watch either.
    theirs = reservations.create_block(
        actor="test",
        name="all instructors",
        image=world.image,
        group=role_group,
        seats=2,
        start=world.start + 72 * H,
        end=world.start + 73 * H,
        created_by=world.users["admin"],
    )
    assert not access.can_manage_block(instructor, theirs)
    assert api(instructor).post(f"/api/v1/block-allocations/{theirs.pk}/cancel/").status_code == 404
    seat = Reservation.objects.filter(block=theirs).exclude(user=instructor).get()  # a seat not theirs
    assert api(instructor).get(f"/api/v1/reservations/{seat.pk}/").status_code == 404


def test_an_instructor_sees_and_cancels_their_groups_blocks(world, api):
    instructor = world.users["instructor"]
    listed = api(instructor).get("/api/v1/reservations/").json()["results"]
    assert [r["id"] for r in listed] == [world.seat.pk]
    assert api(instructor).post(f"/api/v1/block-allocations/{world.block.pk}/cancel/").status_code == 204
    assert BlockAllocation.objects.get(pk=world.block.pk).canceled


def test_an_auditor_reads_an_operator_page_but_cannot_post_to_it(world):
    client = page(world, "auditor")
    assert client.get(f"/inventory/hypervisors/{world.host.pk}/").status_code == 200
    assert client.get("/vms/plans/").status_code == 200
    response = client.post(f"/inventory/hypervisors/{world.host.pk}/state/", {"state": "offline", "reason": "x"})
    assert response.status_code == 403
    assert Hypervisor.objects.get(pk=world.host.pk).state == "online"


def test_an_operator_sees_no_users_data(world, api):
    operator = world.users["operator"]
    assert api(operator).get("/api/v1/reservations/").json()["count"] == 0
    assert page(world, "operator").get("/reservations/?everyone=1").context["page"].paginator.count == 0
    assert api(world.users["auditor"]).get("/api/v1/reservations/").json()["count"] == 1


def test_a_maintainer_cannot_give_an_image_a_group_not_theirs(world, api):
    maintainer = world.users["maintainer"]
    response = api(maintainer).patch(f"/api/v1/images/{world.ours.pk}/", {"groups": [world.cs102.pk]}, format="json")
    assert response.status_code == 403
    assert list(world.ours.groups.values_list("name", flat=True)) == ["cs101"]
    made = api(maintainer).post("/api/v1/images/", {"name": "cs101-new", "groups": [world.cs101.pk]}, format="json")
    assert made.status_code == 201, made.content
    assert api(maintainer).post("/api/v1/images/", {"name": "mine-public"}, format="json").status_code == 403


def test_a_maintainer_cannot_give_an_image_their_role_group(world, api):
    maintainer = world.users["maintainer"]
    role_group = access.role_group("image-maintainer")
    assert list(access.maintained_groups(maintainer)) == [world.cs101]
    body = {"name": "all-maintainers", "groups": [role_group.pk]}
    made = api(maintainer).post("/api/v1/images/", body, format="json")
    assert made.status_code == 403, made.content
    assert not Image.objects.filter(name="all-maintainers").exists()


def test_roles_are_assigned_through_the_api_by_admins_only(world, api):
    user = world.users["user"]
    url = f"/api/v1/users/{user.pk}/roles/"
    assert api(world.users["operator"]).put(url, {"roles": ["operator"]}, format="json").status_code == 403
    assert api(world.users["auditor"]).get(url).status_code == 403
    response = api(world.users["admin"]).put(url, {"roles": ["operator", "auditor"]}, format="json")
    assert response.status_code == 200 and response.json()["roles"] == ["operator", "auditor"]
    assert api(world.users["admin"]).get(url).json()["roles"] == ["operator", "auditor"]
    assert api(world.users["admin"]).put(url, {"roles": ["pope"]}, format="json").status_code == 400
    assert api(user).get("/api/v1/me/").json()["roles"] == ["operator", "auditor"]


def test_a_group_given_a_role_permission_carries_the_role(world):
    """A directory group mapped onto any vclmgr group gives the role if that group has it."""
    from django.contrib.auth.models import Permission

    faculty = Group.objects.create(name="faculty")
    faculty.permissions.add(Permission.objects.get(codename="teach", content_type__app_label="accounts"))
    user = world.users["user"]
    user.groups.add(faculty)
    assert access.roles(type(user).objects.get(pk=user.pk)) == ["instructor"]


def test_granting_a_role_joins_its_group_only(world):
    """A role held through a directory group stays the directory's: granting another role does
    not make it a membership of its role group (set_roles would)."""
    from django.contrib.auth.models import Permission

    from core.changelog import history

    faculty = Group.objects.create(name="faculty")
    faculty.permissions.add(Permission.objects.get(codename="approve", content_type__app_label="accounts"))
    user = world.users["user"]
    user.groups.add(faculty)
    assert access.grant_role(user, "instructor", actor="test") == [user]
    assert access.roles(user) == ["instructor", "approver"]
    assert set(user.groups.values_list("name", flat=True)) == {"faculty", "instructor"}
    assert history(user)[0].changes == {"roles": [["approver"], ["instructor", "approver"]]}
    assert access.grant_role(user, "instructor", actor="test") == [] and len(history(user)) == 1
    user.groups.remove(faculty)
    assert access.roles(type(user).objects.get(pk=user.pk)) == ["instructor"]
    with pytest.raises(ValueError):
        access.grant_role(user, "admin", actor="test")


def test_granting_a_role_to_many_takes_a_few_statements(world, django_user_model):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    many = [django_user_model.objects.create_user(f"student{n}") for n in range(50)]
    with CaptureQueriesContext(connection) as queries:
        gained = access.grant_role([*many, world.users["instructor"]], "instructor", actor="test")
    assert gained == many and len(queries) < 20
    assert all(access.roles(django_user_model.objects.get(pk=u.pk)) == ["instructor"] for u in many[:3])


def test_the_holders_of_a_role_are_those_can_says_in_one_statement(world, django_user_model):
    from django.contrib.auth.models import Permission

    teach = Permission.objects.get(codename="teach", content_type__app_label="accounts")
    faculty = Group.objects.create(name="faculty")
    faculty.permissions.add(teach)
    direct = django_user_model.objects.create_user("direct")
    direct.user_permissions.add(teach)
    world.users["user"].groups.add(faculty)
    gone = django_user_model.objects.create_user("gone", is_active=False)
    access.set_roles(gone, ["instructor"], actor=gone)
    everyone = django_user_model.objects.all()
    held = set(everyone.filter(access.holders("teach")).values_list("username", flat=True))
    assert held == {u.username for u in everyone if access.can(u, "teach")}
    name = {key: user.username for key, user in world.users.items()}
    assert {name["instructor"], name["admin"], name["user"], "direct"} <= held
    assert not {name["amy"], name["operator"], "gone"} & held
    with pytest.raises(ValueError):
        access.holders("see_all")


@pytest.mark.slow
def test_the_websocket_subscribes_by_role(make_host, django_user_model, session_cookie, ws_connect):
    """The same authoriser through the real consumer (a daphne process): an operator follows a
    host and the dashboard but no user's stream; an auditor follows a user's; a plain user neither."""
    host = make_host("node-ws")
    make = django_user_model.objects.create_user
    operator, auditor, user = make("op"), make("au"), make("us")
    access.set_roles(operator, ["operator"], actor="test")
    access.set_roles(auditor, ["auditor"], actor="test")
    wanted = [f"hypervisor.{host.pk}", "admin", f"user.{user.pk}"]
    expected = {
        operator: (wanted[:2], wanted[2:]),
        auditor: (wanted, []),
        user: ([f"user.{user.pk}"], wanted[:2]),
    }
    for persona, (allowed, denied) in expected.items():
        ws = ws_connect(cookie=session_cookie(persona))
        ws.send({"action": "subscribe", "topics": wanted})
        reply = ws.receive_until(lambda m: m["type"] == "subscribed")
        assert (reply["topics"], reply["denied"]) == (allowed, denied), persona.username
        ws.close()
