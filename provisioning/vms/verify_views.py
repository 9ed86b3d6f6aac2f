"""The staff page of cluster.verify's latest report: its findings, a run now, and releasing an
orphan claim (the one repair offered; an admin confirms it with the button)."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from inventory.views import staff_required
from provisioning.jobs import services as jobs
from provisioning.vms import verify
from vclmgr.errors import Conflict


@staff_required
def report(request):
    latest = verify.latest()
    findings = sorted(latest.findings, key=lambda f: (f["kind"], f.get("host", ""))) if latest else []
    return render(request, "vms/verify.html", {"report": latest, "findings": findings})


@staff_required
@require_POST
def run_now(request):
    job = jobs.submit("cluster.verify", {}, actor=request.user, source=f"web:{request.user.get_username()}")
    messages.success(request, f"cluster.verify submitted as job {job.pk}; reload when it has ended.")
    return redirect("vms:verify")


@staff_required
@require_POST
def release_claim(request, pk):
    try:
        verify.release_orphan_claim(pk, "released in the web UI after verify", actor=request.user)
    except (Conflict, verify.Allocation.DoesNotExist) as exc:
        messages.error(request, str(exc) or f"no claim {pk}")
    else:
        messages.success(request, f"Claim {pk} released.")
    return redirect("vms:verify")
