"""A batch run on an environment, on the simulator: every machine built on one host with its
network, the command on the entry machine, its output and artifacts from there, every machine
and network gone after."""

import pytest
from django.core.exceptions import ValidationError

from capacity.models import Allocation
from drivers.sim.models import SimNetwork, SimNIC, SimVM
from environments import services as environment_services
from jobs.models import Job
from provisioning.models import VM, PrivateNetwork
from runs import services
from runs.models import Run
from tests.environments.conftest import member

pytestmark = pytest.mark.django_db


@pytest.fixture
def pair(alice, image):
    """A server and a client on one network; the client is where the command runs."""
    small = {"vcpus": 1, "memory_mib": 512, "disk_gib": 1}
    return environment_services.create_template(
        actor=alice,
        name="client-server",
        members=[member("client", image, "lan", entry=True, **small), member("server", image, "lan", **small)],
        networks=[{"name": "lan", "cidr": "192.168.50.0/24"}],
    )


def test_a_run_on_an_environment_runs_on_its_entry_machine_and_leaves_nothing(
    sim_host, pair, alice, profile, sync_jobs
):
    profile(output="hello from the client\n", exit_status=0, files={"result.txt": "42\n"})
    run = services.submit(
        actor=alice, owner=alice, environment=pair, argv=["sh", "-c", "curl server"], artifacts=["result.txt"]
    )
    assert run.environment == pair and (run.vcpus, run.memory_mib) == (2, 1024)  # both machines held
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "success", run.reason
    assert b"".join(bytes(c.data) for c in run.output.order_by("seq")) == b"hello from the client\n"
    assert run.vm.hostname == "client" and [vm.hostname for vm in run.machines.all()] == ["server"]
    assert {vm.networks.get().key for vm in (run.vm, run.machines.get())} == {f"run{run.pk}-lan"}
    assert [f.path for f in run.files.filter(kind="artifact")] == ["result.txt"]
    # Both machines were built on the host, on the run's own network, and are gone now.
    assert {vm.host_id for vm in VM.objects.all()} == {sim_host.pk}  # (each one built: it had a host)
    assert Job.objects.get(pk=run.job).status == "success"
    assert not SimVM.objects.exists() and not SimNIC.objects.exists() and not SimNetwork.objects.exists()
    assert set(VM.objects.values_list("state", flat=True)) == {"destroyed"} and VM.objects.count() == 2
    assert PrivateNetwork.objects.get().key == f"run{run.pk}-lan"
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_an_environment_run_that_does_not_fit_says_which_machine_and_leaves_nothing(make_host, pair, alice, sync_jobs):
    make_host("tiny", cpus=1, memory_mib=768)
    run = services.submit(actor=alice, owner=alice, environment=pair, argv=["true"])
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "error" and "its machines could not be placed" in run.error
    assert "must share a host" in run.error
    assert not VM.objects.exists() and not Allocation.objects.exists() and not PrivateNetwork.objects.exists()


def test_an_environment_run_refuses_a_size_or_an_image_and_a_template_it_may_not_use(sim_host, pair, alice, bob):
    with pytest.raises(ValidationError, match="takes its images and sizes from the template"):
        services.submit(actor=alice, owner=alice, environment=pair, argv=["true"], vcpus=4)
    with pytest.raises(ValidationError, match="no such environment, or you may not use it"):
        services.submit(actor=bob, owner=bob, environment=pair.pk, argv=["true"])
    assert not Run.objects.exists()


def test_a_run_whose_template_changed_since_it_was_submitted_is_not_built(sim_host, pair, alice, image, sync_jobs):
    run = services.submit(actor=alice, owner=alice, environment=pair, argv=["true"])
    members, networks = environment_services.as_specs(pair)
    environment_services.update_template(pair, actor=alice, members=[*members, member("extra", image, "lan")])
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "error" and run.error == (
        "environment client-server has other machines than when it was submitted (its quotas counted those): "
        "submit it again"
    )
    assert not VM.objects.exists() and not Allocation.objects.exists() and not PrivateNetwork.objects.exists()


@pytest.fixture
def define_fails(monkeypatch):
    """``define_fails(n)``: the simulator's first ``n`` defines fail, on whichever host;
    returns the hosts each define was asked on, in order."""
    from drivers import base
    from drivers.sim.driver import SimDriver

    asked, create = [], SimDriver.create

    def make(n):
        def spy(self, spec):
            asked.append(self.host().name)
            if len(asked) <= n:
                raise base.DriverError(f"injected define failure {len(asked)}", permanent=False)
            return create(self, spec)

        monkeypatch.setattr(SimDriver, "create", spy)
        return asked

    return make


def nothing_left():
    assert not SimVM.objects.exists() and not SimNIC.objects.exists() and not SimNetwork.objects.exists()
    assert set(VM.objects.values_list("state", flat=True)) <= {"destroyed", "failed"}
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_machine_that_fails_to_build_is_built_again_elsewhere_with_its_network(
    make_host, pair, alice, profile, sync_jobs, define_fails
):
    make_host("one", cpus=8, memory_mib=8192)
    make_host("two", cpus=8, memory_mib=8192)
    asked = define_fails(1)
    profile(output="hello from the client\n", exit_status=0)
    run = services.submit(actor=alice, owner=alice, environment=pair, argv=["sh", "-c", "curl server"])
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "success", run.reason
    assert b"".join(bytes(c.data) for c in run.output.order_by("seq")) == b"hello from the client\n"
    failed_on = asked[0]
    # Both machines built again, as new VMs, together on the other host, on the run's retried network.
    current = [run.vm, *run.machines.all()]
    assert sorted(vm.hostname for vm in current) == ["client", "server"]
    assert {vm.host.name for vm in current} == {"one", "two"} - {failed_on}
    assert {vm.networks.get().key for vm in current} == {f"run{run.pk}r2-lan"}
    assert VM.objects.count() == 4  # the first two, and their replacements
    trail = " ".join(entry["reason"] if isinstance(entry, dict) else str(entry) for entry in run.reason)
    assert f"failed on {failed_on}" in trail and "retrying on another host" in trail, trail
    nothing_left()


def test_an_environment_run_with_no_other_host_for_its_retry_fails_and_leaves_nothing(
    make_host, pair, alice, sync_jobs, define_fails
):
    make_host("one", cpus=8, memory_mib=8192)
    make_host("tiny", cpus=1, memory_mib=768)  # one machine fits there, not both
    define_fails(1)
    run = services.submit(actor=alice, owner=alice, environment=pair, argv=["true"])
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "error" and "injected define failure 1" in run.error
    assert "no other host for a retry" in run.error and "must share a host" in run.error, run.error
    assert VM.objects.count() == 2  # no replacement was made
    nothing_left()


def test_an_environment_run_is_built_again_once_only(make_host, pair, alice, sync_jobs, define_fails):
    for name in ("one", "two", "three"):
        make_host(name, cpus=8, memory_mib=8192)
    asked = define_fails(100)
    run = services.submit(actor=alice, owner=alice, environment=pair, argv=["true"])
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "error" and "built again on another host once already" in run.error, run.error
    assert len(asked) == 2 and asked[0] != asked[1]  # the first host, and one other: not a third
    nothing_left()


def test_the_old_machines_of_a_retry_go_before_the_run_moves_even_when_their_destroy_fails(
    make_host, pair, alice, profile, sync_jobs, monkeypatch
):
    from drivers import base
    from drivers.sim.driver import SimDriver

    make_host("one", cpus=8, memory_mib=8192)
    make_host("two", cpus=8, memory_mib=8192)
    defines, destroys = [], []
    create, destroy = SimDriver.create, SimDriver.destroy

    def second_define_fails(self, spec):  # the server builds, then the client fails beside it
        defines.append(self.host().name)
        if len(defines) == 2:
            raise base.DriverError("injected define failure", permanent=False)
        return create(self, spec)

    def first_destroy_fails(self, key):  # the server, removed before the retry: its host fails it once
        destroys.append(key)
        if key == VM.objects.filter(hostname="server").order_by("pk").first().key and destroys.count(key) == 1:
            raise base.DriverError("injected destroy failure", permanent=False)
        return destroy(self, key)

    monkeypatch.setattr(SimDriver, "create", second_define_fails)
    monkeypatch.setattr(SimDriver, "destroy", first_destroy_fails)
    profile(output="ok\n", exit_status=0)
    run = services.submit(actor=alice, owner=alice, environment=pair, argv=["true"])
    sync_jobs.drain()
    run = Run.objects.get(pk=run.pk)
    assert run.state == "success", run.reason
    assert {vm.host.name for vm in [run.vm, *run.machines.all()]} == {"one", "two"} - {defines[0]}
    # The old server was left in error with its claim and a destroy queued, which removed it:
    # nothing of the first attempt stays on its host, nor holds its room.
    old_server = VM.objects.filter(hostname="server").order_by("pk").first()
    assert destroys.count(old_server.key) == 2 and old_server.state == "destroyed"
    assert Job.objects.filter(opcode="vm.destroy", params__vm=old_server.pk, status="success").exists()
    nothing_left()
