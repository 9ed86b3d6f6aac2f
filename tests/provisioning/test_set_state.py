"""``services.set_state`` from a VM the caller knows (a job's run): one conditional UPDATE while
the row still holds what the caller knows of it, a fresh read when it does not."""

import pytest
from django.contrib.contenttypes.models import ContentType

from core.models import ObjectChange
from provisioning import services
from provisioning.models import VM
from provisioning.opcodes.common import load_vm

pytestmark = pytest.mark.django_db


def _vm(owner, image):
    vm, _ = services.request_vm(actor=owner, owner=owner, image=image)
    return vm


def _last_change(vm):
    kind = ContentType.objects.get_for_model(VM)
    return ObjectChange.objects.filter(content_type=kind, object_id=str(vm.pk)).order_by("-pk").first()


def test_a_known_vm_is_written_as_known(sim_host, image, alice):
    known = load_vm(_vm(alice, image).pk)
    written = services.set_state(known.pk, VM.State.DEFINING, "defining", actor="test", known=known, host=sim_host)
    assert written is known and written.state == VM.State.DEFINING and written.host == sim_host
    row = VM.objects.get(pk=known.pk)
    assert (row.state, row.host_id) == (VM.State.DEFINING, sim_host.pk)
    assert _last_change(known).changes == {"state": ["requested", "defining"], "host": [None, sim_host.name]}


def test_it_reads_the_row_again_when_it_changed_behind_the_caller(sim_host, image, alice):
    known = load_vm(_vm(alice, image).pk)
    VM.objects.filter(pk=known.pk).update(state=VM.State.LOST, error="its host died")  # not through the run
    written = services.set_state(known.pk, VM.State.DEFINING, "defining", actor="test", known=known, host=sim_host)
    assert written is not known and written.state == VM.State.DEFINING
    row = VM.objects.get(pk=known.pk)
    assert (row.state, row.error, row.host_id) == (VM.State.DEFINING, "its host died", sim_host.pk)
    assert _last_change(known).changes["state"] == ["lost", "defining"]  # the row's old state, not the known one


def test_fields_it_does_not_write_are_left_as_the_row_has_them(sim_host, image, alice):
    known = load_vm(_vm(alice, image).pk)
    VM.objects.filter(pk=known.pk).update(name="renamed")  # a column the state change does not write
    services.set_state(known.pk, VM.State.DEFINING, "defining", actor="test", known=known)
    assert VM.objects.filter(pk=known.pk, name="renamed", state=VM.State.DEFINING).exists()
