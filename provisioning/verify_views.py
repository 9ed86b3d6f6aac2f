"""The staff page of cluster.verify's latest report: its findings, a run now, and the repairs
(release an orphan claim now; adopt, destroy, take the host's state, mark gone as jobs), each
confirmed by the admin with its button."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts import access
from accounts.access import operator_page
from core.errors import Conflict
from jobs import services as jobs
from provisioning import repair, verify

admin_page = access.page(read="admin", write="admin")


@operator_page
def report(request):
    latest = verify.latest()
    findings = sorted(latest.findings, key=lambda f: (f["kind"], f.get("host", ""))) if latest else []
    return render(request, "vms/verify.html", {"report": latest, "findings": findings})


@operator_page
@require_POST
def run_now(request):
    job = jobs.submit("cluster.verify", {}, actor=request.user, source=f"web:{request.user.get_username()}")
    messages.success(request, f"cluster.verify submitted as job {job.pk}; reload when it has ended.")
    return redirect("vms:verify")


@operator_page
@require_POST
def release_claim(request, pk):
    try:
        verify.release_orphan_claim(pk, "released in the web UI after verify", actor=request.user)
    except (Conflict, verify.Allocation.DoesNotExist) as exc:
        messages.error(request, str(exc) or f"no claim {pk}")
    else:
        messages.success(request, f"Claim {pk} released.")
    return redirect("vms:verify")


@admin_page  # repairs destroy and adopt VMs (users' data): administrators only
@require_POST
def repair_finding(request, action):
    """Submit the job of one repair (``repair.submit`` resolves and checks the fields)."""
    fields = {name: request.POST.get(name, "") for name in ("host", "key", "owner", "vm")}
    fields["force"] = request.POST.get("force") == "1"
    try:
        job = repair.submit(action, fields, actor=request.user, source=f"web:{request.user.get_username()}")
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"repair.{action} submitted as job {job.pk}; verify again when it has ended.")
    return redirect("vms:verify")
