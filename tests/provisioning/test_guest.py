"""The guest side of a VM: the login ``vm_spec`` hands the driver, and "ready means reachable"."""

import types

import pytest
from passlib.hash import sha512_crypt

from drivers.base import DriverError
from drivers.sim.driver import SimDriver
from jobs.models import Job
from provisioning import services
from provisioning.models import VM
from provisioning.opcodes import guest
from provisioning.opcodes.lifecycle import vm_spec
from reservations import services as reservations
from reservations.models import Reservation
from tests.listeners import tcp_listener
from tests.provisioning.conftest import sim_image

H = 3600
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ0ZXN0a2V5Zm9ydmNsbWdyZ3Vlc3RzAAAAAAAAAA alice@laptop"


def built(vm):
    vm = VM.objects.select_related("image", "variant", "variant__image").get(pk=vm.pk)
    return vm


def reserve(user, image, sync_jobs, **kwargs):
    from datetime import timedelta

    reservation = reservations.reserve(user, image, actor=user, duration=timedelta(hours=1), **kwargs)
    sync_jobs.drain()
    return Reservation.objects.get(pk=reservation.pk)


def test_a_reservations_vm_is_given_its_login_with_the_password_only_as_a_hash(sim_host, image, alice, sync_jobs):
    reservation = reserve(alice, image, sync_jobs)
    assert reservation.status == "ready"
    spec = vm_spec(built(reservation.vm))
    login = spec.guest
    password = reservation.get_password()
    assert login.login == reservation.connect_user == "alice" and login.hostname == reservation.vm.key
    assert sha512_crypt.verify(password, login.password_hash) and login.ssh_keys == ()
    assert password not in repr(spec) and login.password_hash not in repr(spec)
    assert vm_spec(built(reservation.vm)).guest.instance_id != login.instance_id  # fresh per seed
    job = Job.objects.get(opcode="vm.create")
    assert "$6$" not in str(job.steps) + str(job.result) and password not in str(job.steps) + str(job.result)


def test_a_key_holder_gets_the_key_and_no_password_and_the_images_user_data(sim_host, image, alice, sync_jobs):
    services.update_image(image, actor="test", user_data="#cloud-config\npackages: [htop]\n")
    reservation = reserve(alice, image, sync_jobs, ssh_key=KEY + "\n")
    login = vm_spec(built(reservation.vm)).guest
    assert login.ssh_keys == (KEY,) and login.password_hash is None
    assert login.image_user_data.startswith("#cloud-config")


def test_the_login_is_made_before_the_vm_and_kept_when_ready(sim_host, image, django_user_model, sync_jobs):
    user = django_user_model.objects.create_user("First.Last@Example", "f@example.org", "pw-123456789")
    from datetime import timedelta

    reservation = reservations.reserve(user, image, actor=user, duration=timedelta(hours=1))
    reservation.refresh_from_db()
    assert reservation.connect_user == "first_last_example" and reservation.get_password()
    before = reservation.get_password()
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready" and reservation.get_password() == before
    assert reservations.connection(reservation)["user"] == "first_last_example"


def test_a_vm_without_a_reservation_keeps_the_images_own_login(sim_host, image, alice, sync_jobs):
    vm, _job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    assert vm_spec(built(vm)).guest is None


def test_connection_details_carry_a_forwarded_port(sim_host, image, alice, sync_jobs):
    reservation = reserve(alice, image, sync_jobs)
    assert reservations.connection(reservation)["port"] == 22
    VM.objects.filter(pk=reservation.vm_id).update(port=40222)
    reservation = Reservation.objects.get(pk=reservation.pk)
    details = reservations.connection(reservation)
    assert details["port"] == 40222 and details["command"] == f"ssh -p 40222 alice@{details['address']}"


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that sends ``greeting`` (set by the test) to each client."""
    state = types.SimpleNamespace(greeting=b"")

    def greet(conn, stop):
        if state.greeting:
            conn.sendall(state.greeting)
        stop.wait(0.3)

    with tcp_listener(greet) as state.port:
        yield state


def test_a_bare_tcp_accept_is_not_an_answer_a_banner_is(listener):
    port = listener.port
    assert not guest.answers("127.0.0.1", port, "ssh", timeout=0.5)
    listener.greeting = b"SSH-2.0-dropbear_2022.83\r\n"
    assert guest.answers("127.0.0.1", port, "ssh", timeout=0.5)
    assert not guest.answers("127.0.0.1", port, "rdp", timeout=0.5)


def test_wait_answer_names_the_guest_port_and_the_timeout(listener, image, db):
    services.update_image(image, actor="test", ready_timeout=1)
    vm = VM(image=image, port=listener.port, vcpus=1, memory_mib=256, disk_gib=1)
    with pytest.raises(DriverError, match=r"^guest did not answer on port 22 within 1 s$") as caught:
        guest.wait_answer(vm, "127.0.0.1", AlwaysRunning(), poll=0.1)
    assert not caught.value.permanent  # the retry-on-another-host path runs


class AlwaysRunning:
    """A host whose VM keeps running (so only the silence of the guest ends the wait)."""

    def state(self, key):
        from drivers.base import VMState

        return VMState.RUNNING


def test_a_guest_that_never_answers_is_retried_then_fails_with_the_reason(
    make_host, image, alice, sync_jobs, monkeypatch
):
    make_host("sim-1", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", cpus=8, memory_mib=8192, disk_gib=200)
    services.update_image(image, actor="test", ready_timeout=1)
    monkeypatch.setattr(SimDriver, "boots_guests", True)
    monkeypatch.setattr(guest, "answers", lambda *args, **kwargs: False)
    reservation = reserve(alice, image, sync_jobs)
    assert reservation.status == "failed" and reservation.attempts == 2
    assert "guest did not answer on port 22 within 1 s" in reservation.error
    from capacity.models import Allocation
    from drivers.sim.models import SimVM

    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert not SimVM.objects.exclude(state="destroyed").exists()


def test_a_vm_asked_for_through_the_api_with_a_key_lets_its_owner_in(sim_host, image, alice, api, sync_jobs):
    response = api(alice).post("/api/v1/vms/", {"image": image.pk, "ssh_key": KEY}, format="json")
    assert response.status_code == 202, response.content
    sync_jobs.drain()
    login = vm_spec(built(VM.objects.get(pk=response.json()["vm"]))).guest
    assert (login.login, login.ssh_keys, login.password_hash) == ("alice", (KEY,), None)


def test_the_reservation_page_shows_a_forwarded_port(sim_host, image, alice, client, sync_jobs):
    reservation = reserve(alice, image, sync_jobs)
    VM.objects.filter(pk=reservation.vm_id).update(port=40222)
    client.force_login(alice)
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert 'id="connect-port">40222<' in page and "ssh -p 40222 alice@" in page


@pytest.fixture
def windows_image(db):
    return sim_image("win-2022", "Windows Server 2022")


def secrets_shown(password):
    """Where a password must never appear: jobs, events, the change log, the history, ``vm list``."""
    import io

    from django.core.management import call_command

    from core.models import Event, ObjectChange
    from reservations.models import ReservationHistory

    out = io.StringIO()
    call_command("vm", "list", stdout=out)
    texts = [out.getvalue()]
    assert Job.objects.exists() and Event.objects.exists() and VM.objects.get().key in texts[0]  # not vacuous
    texts += [str(job.steps) + str(job.result) + str(job.params) for job in Job.objects.all()]
    texts += [str(event.data) for event in Event.objects.all()]
    texts += [str(vars(row)) for model in (ObjectChange, ReservationHistory) for row in model.objects.all()]
    return [text for text in texts if password in text]


def test_a_windows_reservation_gets_the_cloudbase_init_flavour_with_the_clear_password(
    sim_host, windows_image, django_user_model, sync_jobs
):
    from drivers import cloudinit

    user = django_user_model.objects.create_user("Student.With.A.Long.Name", "s@example.org", "pw-123456789")
    reservation = reserve(user, windows_image, sync_jobs, ssh_key=KEY)
    assert reservation.status == "ready"
    password = reservation.get_password()
    assert password, "RDP needs a password even when the user gave a key"
    spec = vm_spec(built(reservation.vm))
    login = spec.guest
    assert (login.flavour, login.password, login.password_hash) == ("cloudbase-init", password, None)
    assert login.login == reservation.connect_user == "student_with_a_long_" and login.ssh_keys == (KEY,)
    [entry] = yaml_users(cloudinit.user_data(login))
    assert entry["passwd"] == password and entry["groups"] == ["Administrators", "Remote Desktop Users"]
    assert password not in repr(spec)
    assert reservations.connection(reservation)["user"] == "student_with_a_long_"
    assert not secrets_shown(password)


def test_a_linux_reservation_never_gets_the_clear_password(sim_host, image, alice, sync_jobs):
    reservation = reserve(alice, image, sync_jobs)
    login = vm_spec(built(reservation.vm)).guest
    assert (login.flavour, login.password) == ("cloud-init", None)
    assert sha512_crypt.verify(reservation.get_password(), login.password_hash)


def yaml_users(text):
    import yaml

    return yaml.safe_load(text)["users"]


def test_one_time_passwords_meet_windows_default_policy():
    from reservations.logins import _one_time_password

    for _ in range(300):
        word = _one_time_password()
        assert len(word) == 16 and any(c.isupper() for c in word) and any(c.islower() for c in word)
        assert any(c.isdigit() for c in word)


def test_a_probe_is_short_while_the_wait_is_young_and_patient_as_it_ages():
    assert guest.probe_timeout(0) == guest.PROBE_FIRST < 0.5
    assert guest.probe_timeout(0) < guest.probe_timeout(10) < guest.probe_timeout(20) < guest.PROBE_PATIENCE
    assert guest.probe_timeout(60) == guest.probe_timeout(600) == guest.PROBE_PATIENCE


def test_a_vm_that_stops_while_booting_fails_at_the_first_probe_unanswered(listener, image, db):
    vm = VM(image=image, port=listener.port, vcpus=1, memory_mib=256, disk_gib=1)

    class Stopped:
        def state(self, key):
            from drivers.base import VMState

            return VMState.STOPPED

    with pytest.raises(DriverError, match="stopped while booting"):
        guest.wait_answer(vm, "127.0.0.1", Stopped(), poll=0.1)


class FakeClock:
    """``time`` for ``wait_answer``: a sleep moves the clock on, and is recorded."""

    def __init__(self):
        self.now, self.sleeps = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


class SilentAgent(AlwaysRunning):
    def __init__(self):
        self.asked = 0

    def agent_answers(self, key):
        self.asked += 1
        return False


@pytest.mark.parametrize("readiness, pause", [("agent", guest.AGENT_POLL), ("port", 0.1)])
def test_a_guest_agent_is_asked_less_often_than_a_port_is_probed(readiness, pause, image, db, monkeypatch):
    clock, driver = FakeClock(), SilentAgent()
    monkeypatch.setattr(guest, "time", clock)
    monkeypatch.setattr(guest, "answers", lambda *args: False)
    image.ready_timeout, image.readiness = 10, readiness
    vm = VM(image=image, vcpus=1, memory_mib=256, disk_gib=1)

    with pytest.raises(DriverError, match="within 10 s"):
        guest.wait_answer(vm, "127.0.0.1", driver)

    assert set(clock.sleeps) == {pause} and guest.AGENT_POLL >= 0.5
    if readiness == "agent":  # on VMware each is a vCenter read, for every seat booting at the bell
        assert driver.asked <= 10 / 0.5 + 2
