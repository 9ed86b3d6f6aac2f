from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from provisioning.models import VM


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_list_info_and_destroy_from_the_cli(sim_host, image, alice, sync_jobs):
    out = run("vm", "create", "debian-12", "--user", "alice", "--memory-mib", "1024")
    assert "requested" in out and "job" in out
    sync_jobs.drain()
    vm = VM.objects.get()
    assert vm.state == "running" and vm.owner == alice and vm.memory_mib == 1024
    assert vm.key in run("vm", "list", "--user", "alice")
    assert "state: running" in run("vm", "info", str(vm.pk))
    run("vm", "destroy", str(vm.pk))
    sync_jobs.drain()
    assert VM.objects.get().state == "destroyed"
    with pytest.raises(CommandError, match="destroyed"):
        run("vm", "start", str(vm.pk))


def test_the_cli_reports_bad_input(sim_host, image, alice):
    with pytest.raises(CommandError, match="memory_mib"):
        run("vm", "create", "debian-12", "--user", "alice", "--memory-mib", "16")
    with pytest.raises(CommandError, match="no image"):
        run("vm", "create", "nope", "--user", "alice")
    with pytest.raises(CommandError, match="no VM 99"):
        run("vm", "stop", "99")
    assert not VM.objects.exists()


def test_resize_from_the_cli(sim_host, image, alice, sync_jobs):
    run("vm", "create", "debian-12", "--user", "alice", "--memory-mib", "1024")
    sync_jobs.drain()
    vm = VM.objects.get()

    assert "submitted" in run("vm", "resize", str(vm.pk), "--vcpus", "2", "--memory-mib", "2048")
    sync_jobs.drain()

    vm.refresh_from_db()
    assert (vm.vcpus, vm.memory_mib, vm.allocation.memory_mib) == (2, 2048, 2048)
    with pytest.raises(CommandError, match="stop it to make it smaller"):
        run("vm", "resize", str(vm.pk), "--memory-mib", "1024")
    with pytest.raises(CommandError, match="give vcpus, memory_mib or both"):
        run("vm", "resize", str(vm.pk))
