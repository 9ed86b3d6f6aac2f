"""A real QEMU guest gets the reservation's login through the NoCloud seed that
drivers/cloudinit.py builds, proven by logging in over SSH with the key and
with the password. Independent of vclmgr's driver: raw libvirt calls (tests/realvm.py).

Three guests are started at once for the whole module (one booted from its disk, two
directly from the kernel), each with a login of its own: the first test proves all three
answer; the login tests use the disk-booted one and a kernel-booted one; the network test
the third, which nothing else logs in to. None of them changes its guest, so sharing them
proves what a fresh boot per test did. The module removes them at its end and checks that
nothing is left."""

import socket
from concurrent.futures import ThreadPoolExecutor

import paramiko
import pytest

from tests import realvm
from tests.realvm import new_login, seed_for, ssh_run

pytestmark = pytest.mark.slow
BOOT_TIMEOUT = 240  # s; 5-10 s alone, but the CPU may be shared with a whole test run
BOOTS = ("disk", "kernel", "kernel")


def assert_gone(conn, pool, name):
    assert name not in [d.name() for d in conn.listAllDomains()]
    assert [v for v in pool.volumes() if v.startswith(name)] == []
    assert not list(pool.path.glob(f"{name}*"))


@pytest.fixture(scope="module")
def guests(libvirt_conn, guest_pool):
    """``[(guest, login), …]`` in the order of ``BOOTS``, all started before any is waited for."""
    users = [new_login() for _ in BOOTS]
    names = [f"{realvm.PREFIX}{u['login']}" for u in users]
    started = []
    try:
        for user, name, boot in zip(users, names, BOOTS, strict=True):
            started.append(realvm.start_guest(guest_pool, name, seed_for(user), boot))
        yield list(zip(started, users, strict=True))
    finally:
        for guest in started:
            realvm.remove_guest(guest_pool, guest)
    for name in names:
        assert_gone(libvirt_conn, guest_pool, name)


def test_three_guests_at_once_all_answer(guests):
    def login(pair):
        guest, user = pair
        guest.wait_agent(BOOT_TIMEOUT)
        guest.wait_ssh(BOOT_TIMEOUT)
        return ssh_run(guest.port, user["login"], "hostname", pkey=user["pkey"]).strip()

    with ThreadPoolExecutor(len(guests)) as pool:
        hostnames = list(pool.map(login, guests))
    assert hostnames == [user["hostname"] for _, user in guests]


@pytest.mark.parametrize("boot", ["disk", "kernel"])
def test_a_guest_lets_the_login_in_by_key_and_by_password(libvirt_conn, guests, boot):
    guest, user = guests[BOOTS.index(boot)]
    guest.wait_agent(BOOT_TIMEOUT)
    guest.wait_ssh(BOOT_TIMEOUT)
    by_key = ssh_run(guest.port, user["login"], "id -un; hostname", pkey=user["pkey"])
    assert by_key.split() == [user["login"], user["hostname"]]
    by_password = ssh_run(guest.port, user["login"], "id -un", password=user["password"])
    assert by_password.split() == [user["login"]]
    with pytest.raises(paramiko.AuthenticationException):
        ssh_run(guest.port, user["login"], "true", password=user["password"] + "x")
    assert guest.name in [d.name() for d in libvirt_conn.listAllDomains()]


def test_the_guest_cannot_reach_the_host_or_beyond(guests):
    """restrict=on: the only traffic is the forward to the guest's port 22. A port open on the
    host's 127.0.0.1, which QEMU user networking would offer the guest as 10.0.2.2, is not
    reachable, and nothing outside is (the guest's own SSH port shows that the probe works)."""
    guest, user = guests[2]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        guest.wait_ssh(BOOT_TIMEOUT)
        probe = (
            f"for t in 127.0.0.1:22 10.0.2.2:{port} 10.0.2.3:53 192.0.2.1:80; do "
            "if nc -w 3 ${t%:*} ${t#*:} </dev/null >/dev/null 2>&1; then echo open $t; else echo closed $t; fi; done"
        )
        out = ssh_run(guest.port, user["login"], probe, pkey=user["pkey"])
        assert out.splitlines() == [
            "open 127.0.0.1:22",
            f"closed 10.0.2.2:{port}",
            "closed 10.0.2.3:53",
            "closed 192.0.2.1:80",
        ]
