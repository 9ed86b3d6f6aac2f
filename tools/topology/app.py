"""The Django side of a topology run, run on the client machine against the run's database.

    python -m tools.topology.app setup IN.json OUT.json   # migrate, hosts, image, users
    python -m tools.topology.app check IN.json OUT.json   # the invariants, read from the rows

``setup`` takes ``{"hosts", "students", "admins", "builders", "lease_seconds", "limit"}`` and
writes the users (name, password, id), the image id; the image's simulated command prints
``RUN_OUTPUT`` for ``RUN_SECONDS`` and exits 0. ``check`` takes what the load generator
recorded (``{"accepted": [ids], "sockets": [...]}``) and writes one entry per invariant:
``{"name": {"ok": bool, "detail": str, ...}}``.
"""

import json
import os
import secrets
import sys
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

HOST_CPUS, HOST_MEMORY, HOST_DISK = 8, 16384, 400  # room for 8 VMs of 1 vCPU, 1 GiB, 20 GiB
VM_SIZE = {"vcpus": 1, "memory_mib": 1024, "disk_gib": 20}
RUN_OUTPUT, RUN_REPEAT, RUN_SECONDS = "compiling unit {n}\n", 40, 4.0


def django_setup():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    import django

    django.setup()


def setup(spec):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.core.management import call_command

    from drivers.sim.models import SimExecProfile
    from inventory import services as inventory
    from jobs import services as jobs
    from provisioning import services as vms

    call_command("migrate", verbosity=0)
    for n in range(spec["hosts"]):
        inventory.create_hypervisor(
            actor="topology",
            name=f"sim{n:03d}",
            address=f"sim{n:03d}.lab",
            driver="sim",
            cpus=HOST_CPUS,
            cpu_ratio=1.0,
            memory_mib=HOST_MEMORY,
            disk_gib=HOST_DISK,
        )
    image = vms.create_image(
        actor="topology",
        name="lab-linux",
        os="Linux",
        min_memory_mib=256,
        default_vcpus=VM_SIZE["vcpus"],
        default_memory_mib=VM_SIZE["memory_mib"],
        default_disk_gib=VM_SIZE["disk_gib"],
    )
    vms.add_variant(
        image, actor="topology", hypervisor_type="sim", format="sim", location="sim://library/lab-linux", size_gib=2
    )
    # A build prints 40 lines over 4 s: a worker's death mid-run must neither lose nor repeat one.
    SimExecProfile.objects.create(image="lab-linux", output=expected_output(), seconds=RUN_SECONDS)
    jobs.set_queue_settings(actor="topology", limit=spec["limit"], lease_seconds=spec["lease_seconds"])
    password = secrets.token_urlsafe(12)
    hashed = make_password(password)  # one hash for every account: each login still verifies it
    users = get_user_model().objects
    made = {"students": [], "admins": [], "builders": []}
    for kind, count, staff in (
        ("students", spec["students"], False),
        ("admins", spec["admins"], True),
        ("builders", spec.get("builders", 0), False),
    ):
        for n in range(count):
            user = users.create(username=f"{kind[:-1]}{n:03d}", password=hashed, is_staff=staff, is_superuser=staff)
            made[kind].append({"username": user.username, "password": password, "id": user.pk})
    return {**made, "image": image.pk}


def expected_output():
    return "".join(RUN_OUTPUT.format(n=n) for n in range(RUN_REPEAT))


# --- the invariants ----------------------------------------------------------------------


def check(recorded):
    return {
        "reservations settled": _settled(recorded["accepted"]),
        "runs ended, output whole": _runs(recorded.get("runs", [])),
        "no host overcommitted": _overcommit(),
        "no VM created twice": _vms_match_hosts(),
        "no claim leaked": _claims(),
        "no job stuck": _jobs(),
        "every event delivered": _delivered(recorded["sockets"]),
    }


def _settled(accepted):
    from reservations.models import Reservation, ReservationHistory

    rows = {r.pk: r for r in Reservation.objects.filter(pk__in=accepted)}
    lost = sorted(set(accepted) - set(rows))
    were_ready = set(
        ReservationHistory.objects.filter(reservation_id__in=accepted, status="ready").values_list(
            "reservation_id", flat=True
        )
    )
    failed = {pk for pk, r in rows.items() if r.status == "failed"}
    failed_silent = sorted(pk for pk in failed if not r_error(rows[pk]))
    stuck = sorted(pk for pk, r in rows.items() if pk not in were_ready and pk not in failed)
    unfinished = sorted(pk for pk, r in rows.items() if r.status not in Reservation.FINAL)
    ok = not lost and not failed_silent and not stuck and not unfinished
    reasons = defaultdict(int)
    for pk in failed:
        reasons[rows[pk].error[:80]] += 1
    detail = (
        f"{len(accepted)} accepted: {len(were_ready)} ready, {len(failed)} failed with a reason, "
        f"{len(lost)} lost, {len(stuck)} stuck, {len(unfinished)} not ended"
    )
    return {
        "ok": ok,
        "detail": detail,
        "ready": len(were_ready),
        "failed": len(failed),
        "lost": lost,
        "stuck": stuck,
        "unfinished": unfinished,
        "silent_failures": failed_silent,
        "failure_reasons": dict(reasons),
    }


def _runs(recorded):
    """Every run in the database (a submission whose answer was lost included) ended; a
    success printed the build's output exactly once; any other end says why."""
    from runs.models import Run

    runs = list(Run.objects.all())
    want = expected_output().encode()
    unfinished = sorted(r.pk for r in runs if not r.is_final)
    silent = sorted(r.pk for r in runs if r.state != "success" and r.is_final and not r.error.strip())
    garbled = sorted(r.pk for r in runs if r.state == "success" and _output(r) != want)
    lost = sorted(set(recorded) - {r.pk for r in runs})
    states = defaultdict(int)
    reasons = defaultdict(int)
    for r in runs:
        states[r.state] += 1
        if r.state != "success" and r.error:
            reasons[r.error[:80]] += 1
    return {
        "ok": not unfinished and not silent and not garbled and not lost,
        "detail": f"{len(runs)} runs ({len(recorded)} answered): {dict(states)}; {len(unfinished)} not ended, "
        f"{len(garbled)} with output lost or repeated, {len(silent)} ended without a reason",
        "runs": len(runs),
        "success": states.get("success", 0),
        "unfinished": unfinished[:20],
        "garbled": garbled[:20],
        "silent": silent[:20],
        "reasons": dict(reasons),
    }


def _output(run):
    return b"".join(bytes(chunk.data) for chunk in run.output.order_by("seq"))


def r_error(reservation):
    return reservation.error.strip()


def _overcommit():
    """A sweep over each host's claims: the sum at every instant within its usable capacity."""
    from django.utils import timezone

    from capacity.models import Allocation
    from inventory.models import Hypervisor

    now = timezone.now()
    far = now + timedelta(days=3650)
    hosts = {h.pk: h for h in Hypervisor.objects.all()}
    per_host = defaultdict(list)
    for a in Allocation.objects.all():
        # A claim counts from when it was written (an extension writes a fresh row for the whole
        # window and releases the old one at once) until its release, else its end or now.
        since = max(a.start, a.created)
        until = a.released if a.released else max(a.end or far, now)
        if until > since:
            per_host[a.host_id].append((since, until, a))
    worst, bad = 0.0, []
    for host_id, spans in per_host.items():
        h = hosts[host_id]
        usable = {
            "vcpus": (h.cpus - h.reserved_cpus) * h.cpu_ratio,
            "memory_mib": (h.memory_mib - h.reserved_memory_mib) * h.memory_ratio,
            "disk_gib": (h.disk_gib - h.reserved_disk_gib) * h.disk_ratio,
        }
        points = sorted([(s, 1, a) for s, _, a in spans] + [(u, 0, a) for _, u, a in spans], key=lambda p: (p[0], p[1]))
        used = defaultdict(float)
        for _, starting, a in points:  # ends sort before starts at the same instant: [start, end)
            sign = 1 if starting else -1
            for dim in usable:
                used[dim] += sign * getattr(a, dim)
            for dim, cap in usable.items():
                worst = max(worst, used[dim] / cap if cap else 0)
                if used[dim] > cap + 1e-6:
                    bad.append(f"{h.name} {dim} {used[dim]:g} > {cap:g}")
    claims = sum(len(v) for v in per_host.values())
    return {
        "ok": not bad,
        "detail": f"{claims} claims on {len(per_host)} hosts, peak use {worst:.0%} of a host",
        "violations": bad[:20],
    }


def _vms_match_hosts():
    from drivers.sim.models import SimVM
    from provisioning.models import VM

    on_hosts = {v.key: v.host.name for v in SimVM.objects.select_related("host")}
    gone = ("destroyed", "failed")
    known = {
        vm.key: vm.host.name if vm.host else None for vm in VM.objects.exclude(state__in=gone).select_related("host")
    }
    unknown = sorted(set(on_hosts) - set(known))  # on a host, vclmgr thinks it gone: made again, or never removed
    missing = sorted(k for k in known if k not in on_hosts and known[k] is not None)
    elsewhere = sorted(k for k in set(known) & set(on_hosts) if known[k] != on_hosts[k])
    total = VM.objects.count()
    ok = not unknown and not missing and not elsewhere
    # Every reservation has ended by now: a VM still live is a pooled run VM or one whose
    # teardown failed; name them so that a reader can tell which.
    alive = VM.objects.exclude(state__in=gone).values_list("pk", "state", "adhoc", "error")[:3] if known else []
    named = "".join(
        f"; live: VM {pk} {state}{' ad hoc' if adhoc else ''}{f' ({error[:80]})' if error else ''}"
        for pk, state, adhoc, error in alive
    )
    return {
        "ok": ok,
        "detail": f"{total} VMs made, {len(on_hosts)} on the sim hosts now, {len(known)} live in vclmgr; "
        f"{len(unknown)} unknown, {len(missing)} missing, {len(elsewhere)} on another host{named}",
        "unknown": unknown[:20],
        "missing": missing[:20],
        "elsewhere": elsewhere[:20],
    }


def _claims():
    from capacity.models import Allocation
    from provisioning.models import VM
    from reservations.models import Reservation

    live = Allocation.objects.filter(released=None)
    held_by_reservation = set(
        Reservation.objects.filter(status__in=Reservation.ACTIVE)
        .exclude(allocation=None)
        .values_list("allocation_id", flat=True)
    )
    held_by_vm = set(
        VM.objects.exclude(state__in=("destroyed", "failed"))
        .exclude(allocation=None)
        .values_list("allocation_id", flat=True)
    )
    leaked = sorted(a.pk for a in live if a.pk not in held_by_reservation | held_by_vm)
    return {
        "ok": not leaked,
        "detail": f"{live.count()} claims unreleased, {len(leaked)} held by nothing",
        "leaked": leaked[:20],
    }


def _jobs():
    from jobs.models import Job

    unfinished = list(
        Job.objects.exclude(status__in=("success", "error", "canceled")).values_list("pk", "opcode", "status")
    )
    counts = defaultdict(int)
    for status in Job.objects.values_list("status", flat=True):
        counts[status] += 1
    # A job may fail under the faults (a worker given up on), never silently: each says why.
    failed = list(Job.objects.filter(status="error").values_list("pk", "opcode", "error_kind", "error_message")[:20])
    silent = [pk for pk, _, _, message in failed if not message.strip()]
    why = "".join(f"; job {pk} {opcode} ({kind}): {message[:120]}" for pk, opcode, kind, message in failed[:3])
    return {
        "ok": not unfinished and not silent,
        "detail": f"{sum(counts.values())} jobs: {dict(counts)}; {len(unfinished)} unfinished{why}",
        "unfinished": unfinished[:20],
        "failed": failed,
    }


def _delivered(sockets):
    """Each socket session saw every event of its topics after its start id, on whichever web server.

    A session is one subscriber's stream across reconnects: ``since`` (the id it started
    from), ``received`` (ids it got), ``last`` (the newest id it got before it closed) and
    ``closed`` (epoch seconds). Owed: every event of its topics after ``since`` up to
    ``last``, and any later one committed more than ``GRACE`` seconds before it closed.
    """
    from datetime import UTC, datetime

    from core.models import Event

    grace = 3.0
    missing, owed_total, servers = [], 0, defaultdict(int)
    for s in sockets:
        closed = datetime.fromtimestamp(s["closed"] - grace, tz=UTC)
        rows = Event.objects.filter(topic__in=s["topics"], id__gt=s["since"]).values_list("id", "created")
        owed = {pk for pk, created in rows if pk <= s["last"] or created < closed}
        got = set(s["received"])
        owed_total += len(owed)
        for server in s["servers"]:
            servers[server] += 1
        if owed - got:
            missing.append(
                {
                    "who": s["who"],
                    "missing": sorted(owed - got)[:10],
                    "servers": s["servers"],
                    "resumed_from": s.get("resumes", []),
                }
            )
    reconnects = sum(max(0, len(s["servers"]) - 1) for s in sockets)
    detail = (
        f"{owed_total} deliveries owed to {len(sockets)} sockets ({reconnects} resumed after a reconnect; "
        f"connections per server {dict(servers)}), {sum(len(m['missing']) for m in missing)} missing"
    )
    return {"ok": not missing, "detail": detail, "missing": missing[:10], "owed": owed_total}


def main():
    phase, source, target = sys.argv[1:4]
    django_setup()
    spec = json.loads(Path(source).read_text())
    result = setup(spec) if phase == "setup" else check(spec)
    Path(target).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
