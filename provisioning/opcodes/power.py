"""Host power jobs, staff only: ``node.power_off`` and ``node.power_on``.

The contract (other parts, such as a squeeze plan's executor, submit these by name):

- ``node.power_off`` ``{"node": <host name>, "reason": <str>}``: refused (the job fails with
  the reason) while the host holds VMs or live/future claims; otherwise the host goes
  offline ("powered off by <submitter> (job <id>): <reason>"), its BMC shuts it down (GracefulShutdown, then
  ForceOff after ``VCLMGR_BMC_GRACEFUL_SECONDS``), and it is left on standby. Result:
  ``{"host", "power_state": "off", "how", "state", "state_reason"}``.
- ``node.power_on`` ``{"node": <host name>, "reason": <str>}``: the BMC powers it on (waits for
  On), then the job waits until the host's hypervisor answers (its driver's facts, as
  ``hypervisor.refresh``) and puts a host vclmgr had powered off back online. Result:
  ``{"host", "power_state": "on", "how", "state", "waited_s"}``.

Both hold the host's exclusive lock (``hypervisor:<id>``), so two power jobs on one host run
one after the other. A BMC that refuses the credential or does not answer fails the job
with the BMC's message and leaves the host as it was.
"""

import itertools
import time

from django.conf import settings
from rest_framework import serializers

from inventory import power
from inventory.models import Hypervisor
from jobs.registry import opcode
from provisioning.opcodes.host_ops import refresh_facts

POLL_SECONDS = 1.0
WAIT_SLICE_SECONDS = 30.0  # well under a task's time slice (half the task timeout)


class NodePowerParams(serializers.Serializer):
    node = serializers.CharField(max_length=100, help_text="the host's name")
    reason = serializers.CharField(max_length=400, help_text="why (it goes into the host's state reason)")

    def validate_node(self, value):
        host = Hypervisor.objects.filter(name__iexact=value).only("pk").first()
        if host is None:
            raise serializers.ValidationError(f"no host named {value!r}")
        return host.name


def node_lock(params):
    host = Hypervisor.objects.filter(name__iexact=params["node"]).only("pk").first()
    return [f"hypervisor:{host.pk if host else params['node']}"]


def _host(params):
    return Hypervisor.objects.get(name__iexact=params["node"])


@opcode("node.power_off", params=NodePowerParams, locks=node_lock, staff_only=True)
def node_power_off(job):
    """Power an empty host off through its BMC (graceful, then forced); it stays offline on standby."""
    return job.step("power-off", _power_off, job.params, _by(job), actor=job.actor)


def _by(job):
    """Who, for the host's state reason: the submitter and the job (``alice (job 12)``)."""
    submitter = job.job.submitter
    return f"{submitter.get_username()} ({job.actor.label})" if submitter is not None else job.actor.label


def _power_off(params, by, *, actor):
    return power.power_off(_host(params), actor=actor, reason=params["reason"], by=by)


@opcode("node.power_on", params=NodePowerParams, locks=node_lock, staff_only=True)
def node_power_on(job):
    """Power a host on through its BMC, wait for its hypervisor to answer, put it back online."""
    params = job.params
    on = job.step("power-on", _power_on, params, actor=job.actor)
    waited = _wait_in_slices(job, params["node"])
    done = job.step("online", _return, params, _by(job), actor=job.actor)
    return {**done, "how": on["how"], "waited_s": waited}


def _power_on(params, *, actor):
    return power.power_on(_host(params), actor=actor, reason=params["reason"])


def _wait_in_slices(job, name):
    """A host may take longer to boot than one task may run: wait in steps of at most
    ``WAIT_SLICE_SECONDS``, so the job can be handed off between them; the clock starts at
    the first step (wall time, recorded, so it survives a hand-off or another worker)."""
    started = job.step("hypervisor", _waiting_since)["at"]
    for n in itertools.count(1):
        answer = job.step(f"hypervisor-{n}", wait_hypervisor, name, started, actor=job.actor)
        if answer["reachable"]:
            return answer["waited_s"]


def _waiting_since():
    return {"at": time.time()}


def wait_hypervisor(name, started, *, actor):
    """Poll the host's driver for one slice, until it answers (a booting host refuses
    connections for a while); ``reachable: False`` when the slice ends first."""
    host = Hypervisor.objects.get(name__iexact=name)
    limit = settings.VCLMGR_POWER_ON_BOOT_SECONDS
    slice_ends = time.monotonic() + WAIT_SLICE_SECONDS
    while True:
        answer = refresh_facts(host.pk, actor=actor)
        waited = round(time.time() - started, 1)
        if answer["reachable"]:
            return {"reachable": True, "waited_s": waited}
        if waited >= limit:
            raise power.PowerError(
                f"{host.name}: powered on, but its hypervisor did not answer within {limit} s: {answer['error']}",
                "timeout",
            )
        if time.monotonic() >= slice_ends:
            return {"reachable": False, "waited_s": waited}
        time.sleep(POLL_SECONDS)


def _return(params, by, *, actor):
    return power.return_to_service(_host(params), actor=actor, reason=params["reason"], by=by)


AFTER_POWER_ON = "after-power-on"  # the child key of a vm.create continued once its host is on


def host_for_vm(host_id, vm_id, wake, *, actor):
    """Is the VM's host ready for it? ``{}`` when online. A standby host (vclmgr powered it off)
    is being powered on for it: the pending ``node.power_on`` (submitted with the claim, or now)
    is returned, and vm.create continues in a child job that depends on it. ``wake=False`` (that
    child): the host had its chance, so a host still not online refuses, with the job's error."""
    from capacity import services as capacity
    from provisioning import services as vms
    from provisioning.opcodes.common import Refused, S

    host = Hypervisor.objects.get(pk=host_id)
    if host.state == Hypervisor.State.ONLINE:
        return {}
    if not host.power_standby:
        raise Refused(f"{host.name} is {host.state} ({host.state_reason})")
    if not wake:
        last = capacity.last_power_on(host)
        error = (last.error_message if last is not None else "") or "it is still not online"
        raise Refused(f"{host.name} was to be powered on for this VM, but {error}")
    job_id = capacity.power_on_for(host, f"vm {vm_id}", actor=actor)
    vms.set_state(vm_id, S.STAGING, f"waiting for {host.name} to be powered on (job {job_id})", actor=actor)
    return {"power_on_job": job_id, "host_name": host.name}
