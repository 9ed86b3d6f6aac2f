"""The guest command channel of the driver contract, on the simulator (emulated results; the
real one, QEMU's guest agent, is exercised in tests/integration/test_runs_real_vm.py), and
libvirt's refusal where no agent can answer (its test driver)."""

import pytest

from drivers.base import Conflict, DriverError, Invalid, NotFound
from drivers.sim.models import SimExecProfile


def running(peer):
    peer.source.stage_image(peer.image)
    spec = peer.spec()
    peer.source.create(spec)
    peer.source.start(spec.key)
    return peer.source, spec.key


def test_exec_is_idempotent_by_tag_and_reads_output_from_any_offset(sim_peer):
    driver, key = running(sim_peer)
    SimExecProfile.objects.create(image=sim_peer.image.name, output="hello\nworld\n", exit_status=3)
    driver.guest_exec(key, "run-1", ["make", "test"], {"CI": "1"}, "/work")
    driver.guest_exec(key, "run-1", ["something", "else"], {}, "/work")  # a retry starts nothing
    status = driver.guest_exec_status(key, "run-1", 0, limit=6)
    assert (status.exited, status.output) == (False, b"hello\n")  # more to read: not ended for this reader
    rest = driver.guest_exec_status(key, "run-1", 6)
    assert (rest.exited, rest.exit_status, rest.output) == (True, 3, b"world\n")


def test_files_go_in_and_come_out_and_glob_keeps_to_its_directory(sim_peer):
    driver, key = running(sim_peer)
    driver.guest_put_file(key, "/work/a/x.xml", b"<x/>")
    driver.guest_put_file(key, "/work/a/b/y.xml", b"<y/>")
    driver.guest_put_file(key, "/elsewhere/z.xml", b"z")
    assert driver.guest_get_file(key, "/work/a/x.xml", 100) == b"<x/>"
    assert driver.guest_glob(key, "/work", ["a/*.xml"]) == ["a/x.xml"]  # * does not cross /
    assert driver.guest_glob(key, "/work", ["a/*/*.xml", "nothing*"]) == ["a/b/y.xml"]
    with pytest.raises(Invalid, match="over the limit"):
        driver.guest_get_file(key, "/work/a/x.xml", 2)
    with pytest.raises(NotFound):
        driver.guest_get_file(key, "/work/none", 10)
    with pytest.raises(Invalid):
        driver.guest_put_file(key, "relative/path", b"")


def test_bad_requests_and_a_stopped_guest_are_refused(sim_peer):
    driver, key = running(sim_peer)
    with pytest.raises(Invalid):
        driver.guest_exec(key, "Bad Tag!", ["true"], {}, "/")
    with pytest.raises(Invalid):
        driver.guest_exec(key, "run-2", [], {}, "/")
    with pytest.raises(Invalid):
        driver.guest_exec(key, "run-2", ["true"], {"1X": "y"}, "/")
    with pytest.raises(NotFound):
        driver.guest_exec_status(key, "run-404", 0)
    driver.stop(key, force=True)
    with pytest.raises(Conflict):
        driver.guest_exec(key, "run-3", ["true"], {}, "/")


def test_libvirt_without_a_guest_agent_is_a_driver_error_not_a_crash(libvirt_peer):
    driver, key = running(libvirt_peer)
    with pytest.raises(DriverError):
        driver.guest_exec(key, "run-1", ["true"], {}, "/")
