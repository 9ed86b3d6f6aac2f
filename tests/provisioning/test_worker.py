"""vm.create through a REAL django-q2 worker process, on the simulator (state in the shared DB)."""

import pytest

from capacity.models import Allocation
from drivers.sim.models import SimVM
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import services
from provisioning.models import VM
from tests.images import sim_image
from tests.jobs.helpers import wait_until

pytestmark = pytest.mark.slow


def test_a_worker_builds_a_vm(worker, django_user_model):
    alice = django_user_model.objects.create_user("alice", "alice@example.org", "alice-pass-1")
    host = Hypervisor.objects.create(
        name="sim-w", address="sim-w.example.org", driver="sim", cpus=8, memory_mib=16384, disk_gib=200
    )
    image = sim_image("debian-12", size_gib=0, min_memory_mib=256, default_memory_mib=512)
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    wait_until(lambda: Job.objects.get(pk=job.pk).is_final, 60, "vm.create to end", worker)
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "running" and vm.host == host and vm.address
    assert SimVM.objects.get(key=vm.key).state == "running"
    assert Allocation.objects.get(pk=vm.allocation_id).released is None
