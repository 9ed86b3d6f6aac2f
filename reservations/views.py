"""Self-service pages: the image catalogue, the reserve form with its live fit check, my
reservations (live status, provisioning steps, connection details, extend / end / cancel) and
block allocations. Thin: reads through ``services.visible``, writes through the services.

Someone else's reservation is a 404 on every view (ids do not leak). Status is live without
reloads: the pages subscribe to ``user.<id>`` (static/js/reservations.js) and refresh the
changed parts with htmx fragments rendered by the same templates.
"""

from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts import access
from core import topics
from core.errors import Conflict
from environments import services as environment_services
from provisioning import services as vms
from provisioning.capture_views import capture_context
from provisioning.forms import ImageFilterForm
from reservations import home, idle, services, showback, usage
from reservations.forms import BlockForm, EnvironmentReserveForm, ExtendForm, ReserveForm, add_service_errors, as_input
from reservations.models import ApprovalRequest, BlockAllocation, Reservation, UsageRollup

PAGE_SIZE = 50
MAX_ID = 2**63 - 1
STEPS = (("staging", "staging the image"), ("defining", "defining the VM"), ("starting", "starting"),
         ("running", "running"))  # fmt: skip
SHOWS = {"active": Reservation.ACTIVE + ("ending",), "past": Reservation.FINAL, "all": None}


def _reservation(request, pk, queryset=None):
    if pk > MAX_ID:  # beyond the column's range: SQLite would raise instead of finding nothing
        raise Http404
    return get_object_or_404(queryset if queryset is not None else services.visible(request.user), pk=pk)


# --- catalogue and reserving ------------------------------------------------------------


@login_required
def catalogue(request):
    visible = vms.visible_images(request.user)
    form = ImageFilterForm(request.GET or None, images=visible)
    images = form.filter(visible).filter(variants__revision__state="production").distinct().order_by("name")
    page = Paginator(images, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "reservations/catalogue.html", {"form": form, "page": page, "query": query.urlencode()})


@login_required
def reserve(request):
    if request.method == "POST":
        form = ReserveForm(request.POST, user=request.user)
        if form.is_valid():
            start, duration = form.window()
            try:
                reservation = services.ask_reservation(
                    request.user,
                    form.cleaned_data["image"],
                    actor=request.user,
                    start=start,
                    duration=duration,
                    ssh_key=form.cleaned_data["ssh_key"],
                    request_key=str(form.cleaned_data["request_key"]),
                    **form.gpu_ask(),
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                if isinstance(reservation, ApprovalRequest):  # the image requires approval: nothing held yet
                    messages.info(request, f"Waiting for approval: {reservation.summary}.")
                    return redirect("reservations:approval", pk=reservation.pk)
                return redirect("reservations:detail", pk=reservation.pk)
    else:  # GET parameters preset the form (the catalogue's Reserve button, an image change)
        initial = {k: request.GET[k] for k in ("image", "when", "start", "duration", "gpus") if request.GET.get(k)}
        form = ReserveForm(initial=initial, user=request.user)
    return render(request, "reservations/reserve.html", {"form": form})


@login_required
def reserve_environment(request, pk):
    """Reserve every machine of an environment template (its page's Reserve button), or ask for
    its approval when a machine's image requires it."""
    template = get_object_or_404(environment_services.visible_templates(request.user).filter(active=True), pk=pk)
    form = EnvironmentReserveForm(request.POST or None, user=request.user, template=template)
    if request.method == "POST" and form.is_valid():
        start, duration = form.window()
        try:
            head = services.ask_environment(
                request.user,
                template,
                actor=request.user,
                start=start,
                duration=duration,
                ssh_key=form.cleaned_data["ssh_key"],
                request_key=str(form.cleaned_data["request_key"]),
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if isinstance(head, ApprovalRequest):  # a machine's image requires approval: nothing held yet
                messages.info(request, f"Waiting for approval: {head.summary}.")
                return redirect("reservations:approval", pk=head.pk)
            return redirect("reservations:detail", pk=head.pk)
    machines = environment_services.expand(template)
    entry = next((m.hostname for m in machines if m.entry), "")
    return render(
        request,
        "reservations/reserve_environment.html",
        {"form": form, "template": template, "machines": machines, "entry": entry},
    )


@login_required
@require_GET
def fit(request):
    """The reserve form's live answer: does it fit as filled in, and if not, when would it?"""
    form = ReserveForm(request.GET, user=request.user)
    form.is_valid()  # the request key is not sent here; only the window matters
    data, answer = form.cleaned_data, None
    fields = ("image", "when", "start", "duration", "gpus", "gpu_model")
    errors = {name: form.errors[name] for name in fields if name in form.errors}
    if not errors:
        now = timezone.now()
        start, duration = form.window()
        start = start or now
        errors = services.validate(request.user, data["image"], start, start + duration, now)
        if not errors:
            answer = services.check_fit(data["image"], max(start, now), start + duration, **form.gpu_ask())
    notes = services.budget_notes(request.user, data["image"], max(start, now)) if answer is not None else []
    context = {"errors": errors, "answer": answer, "limits": form.limits, "budget_notes": notes}
    if answer is not None and answer.earliest is not None:
        context["earliest"] = as_input(answer.earliest)
        context["earliest_label"] = context["earliest"].replace("T", " ")
    return render(request, "reservations/_fit.html", context)


# --- my reservations --------------------------------------------------------------------


@login_required
def reservation_list(request):
    show = request.GET.get("show") if request.GET.get("show") in SHOWS else "active"
    everyone = (access.can(request.user, "see_all") or services.may_manage_blocks(request.user)) and (
        request.GET.get("everyone") == "1"
    )
    reservations = services.visible(request.user).select_related("image", "vm", "user")
    if not everyone:
        reservations = reservations.filter(user=request.user)
    if SHOWS[show]:
        reservations = reservations.filter(status__in=SHOWS[show])
    page = Paginator(reservations, PAGE_SIZE).get_page(request.GET.get("page"))
    query = urlencode({"show": show, **({"everyone": 1} if everyone else {})})
    context = {
        "page": page,
        "query": query,
        "show": show,
        "shows": list(SHOWS),
        "everyone": everyone,
        "topics": "admin" if everyone and access.can(request.user, "see_all") else topics.user_topic(request.user),
        "approvals": home.approvals_of(request.user),  # requests waiting for an approver: no reservation yet
    }
    return render(request, "reservations/reservation_list.html", context)


S = Reservation.Status


def _panel_context(reservation, user):
    now = timezone.now()
    vm_state = reservation.vm.state if reservation.vm else ""
    reached = [name for name, _ in STEPS].index(vm_state) if vm_state in dict(STEPS) else -1
    warn = timedelta(minutes=settings.RESERVATION_WARN_MINUTES)
    alone = reservation.head_id is None  # an environment's other machines are acted on through its head
    # an environment's head: every machine, live (their changes are told on its topic too)
    machines = services.machines_of(reservation) if reservation.environment_id and alone else []
    if machines:  # how each one is reached, from the entry machine and directly
        reach = services.reach(reservation, machines)
        for machine in machines:
            machine.reach = reach[machine.hostname]
    # an environment's Suspend, Resume, Revert: its owner's and administrators' (``operable``)
    may_power = bool(machines) and reservation.status == S.READY
    may_power = may_power and (reservation.user_id == user.pk or access.is_admin(user))
    return {
        "reservation": reservation,
        "machines": machines,
        "history": list(reservation.history.all()),
        "connection": services.connection(reservation),
        "steps": [
            (name, label, "done" if i < reached else "current" if i == reached else "todo")
            for i, (name, label) in enumerate(STEPS)
        ],
        "may_extend": alone and reservation.status in Reservation.ACTIVE and reservation.allocation_id is not None,
        "may_end": alone and reservation.status in (S.PLACING, S.PROVISIONING, S.READY),
        "may_cancel": alone and reservation.status in (Reservation.Status.REQUESTED, Reservation.Status.PENDING),
        "power": services.power_offered(machines) if may_power else [],
        "ending_soon": reservation.status == Reservation.Status.READY and reservation.end - now <= warn,
        "extend_form": ExtendForm(),
        "warn_minutes": settings.RESERVATION_WARN_MINUTES,
        "idle": idle.countdown(reservation, now),
        # its own topic (status, end warnings) and its owner's (the VM's build steps)
        "live_topics": ",".join(
            [f"reservation.{reservation.pk}", topics.user_topic(reservation.user_id)]
            if reservation.user_id
            else [f"reservation.{reservation.pk}"]
        ),
    }


def _detail_queryset(request):
    return services.visible(request.user).select_related("image", "vm", "vm__host", "user", "revision")


@login_required
def reservation_detail(request, pk):
    reservation = _reservation(request, pk, _detail_queryset(request))
    # The capture card is outside the panel: the panel is fetched again on every event.
    # Its VM's owner (the reservation's user) and administrators may capture the VM.
    context = {**_panel_context(reservation, request.user), **capture_context(request, reservation.vm)}
    return render(request, "reservations/reservation_detail.html", context)


@login_required
@require_GET
def reservation_panel(request, pk):
    """The part of the detail page that changes with the status (fetched by htmx on events)."""
    reservation = _reservation(request, pk, _detail_queryset(request))
    return render(request, "reservations/_panel.html", _panel_context(reservation, request.user))


@login_required
@require_POST
def extend(request, pk):
    reservation = _reservation(request, pk)
    form = ExtendForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Extend by: " + " ".join(form.errors["minutes"]))
        return redirect("reservations:detail", pk=pk)
    new_end = reservation.end + timedelta(minutes=form.cleaned_data["minutes"])
    try:
        services.extend(reservation, new_end, actor=request.user)
    except ValidationError as exc:
        messages.error(request, "Not extended: " + " ".join(exc.messages))
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Extended to {timezone.localtime(new_end):%Y-%m-%d %H:%M %Z}.")
    return redirect("reservations:detail", pk=pk)


@login_required
@require_POST
def end(request, pk):
    return _act(request, pk, services.end, "Ending: the VM is being torn down.")


@login_required
@require_POST
def cancel(request, pk):
    return _act(request, pk, services.cancel, "Canceled: its capacity is given back.")


WHOLE = {
    "suspend": (services.suspend, "Suspending every machine of the environment."),
    "resume": (services.resume, "Resuming every machine of the environment."),
    "revert": (services.revert, "Reverting every machine of the environment to its clean state."),
}


@login_required
@require_POST
def whole(request, pk, verb):
    """An environment's Suspend, Resume and Revert buttons (its owner's and administrators')."""
    verb, done = WHOLE[verb]
    return _act(request, pk, verb, done, services.operable(request.user))


def _act(request, pk, verb, done, queryset=None):
    reservation = _reservation(request, pk, queryset)
    try:
        verb(reservation, actor=request.user)
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done)
    return redirect("reservations:detail", pk=pk)


@login_required
def rdp(request, pk):
    reservation = _reservation(request, pk, _detail_queryset(request))
    details = services.connection(reservation)
    if details is None or details["protocol"] != "rdp":
        raise Http404("no RDP connection for this reservation")
    response = HttpResponse(services.rdp_file(reservation), content_type="application/x-rdp")
    response["Content-Disposition"] = f'attachment; filename="reservation-{reservation.pk}.rdp"'
    return response


# --- block allocations ------------------------------------------------------------------


@login_required
def blocks(request):
    manager = services.may_manage_blocks(request.user)
    form = None
    if manager:
        form = BlockForm(request.POST or None, user=request.user)
        if request.method == "POST" and form.is_valid():
            try:
                block = services.create_block(
                    # the weeks keep the local hour of the zone the form was read in
                    actor=request.user,
                    created_by=request.user,
                    time_zone=timezone.get_current_timezone(),
                    **form.cleaned_data,
                )
            except ValidationError as exc:
                add_service_errors(form, exc)
            else:
                messages.success(request, f"Block {block.name}: {block.seats} seats × {block.weeks} weeks reserved.")
                return redirect("reservations:blocks")
    elif request.method == "POST":
        raise PermissionDenied
    now = timezone.now()
    managed_blocks = services.managed_blocks(request.user)[:PAGE_SIZE] if manager else []
    managed = [(b, services.block_usage(b, now)) for b in managed_blocks]
    context = {"form": form, "managed": managed, "classes": home.classes_of(request.user, now)}
    return render(request, "reservations/blocks.html", context)


@login_required
@require_POST
def take_seat(request, pk):
    block = get_object_or_404(BlockAllocation, pk=min(pk, MAX_ID), group__in=request.user.groups.all())
    try:
        seat = services.take_seat(request.user, block, actor=request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("reservations:blocks")
    return redirect("reservations:detail", pk=seat.pk)


@login_required
@require_POST
def cancel_block(request, pk):
    if not services.may_manage_blocks(request.user):
        raise PermissionDenied
    block = get_object_or_404(services.managed_blocks(request.user), pk=min(pk, MAX_ID))
    services.cancel_block(block, actor=request.user, reason=f"block canceled by {request.user.get_username()}")
    messages.success(request, f"Block {block.name} canceled.")
    return redirect("reservations:blocks")


# --- usage reports (staff) -------------------------------------------------------------------


def _usage_report(request):
    if not access.can(request.user, "see_all"):
        raise PermissionDenied
    try:
        first, last, image, group = usage.filters(request.GET)
    except ValueError as exc:
        return None, HttpResponse(str(exc), status=400, content_type="text/plain")
    return usage.report(first, last, image=image, group=group), None


@login_required
@require_GET
def usage_page(request):
    """Staff: hours per image, group and day, peak concurrency, refusals, time to ready."""
    data, error = _usage_report(request)
    if error is not None:
        return error
    images, groups = usage.choices()
    return render(
        request,
        "reservations/usage.html",
        {
            "report": data,
            "images": images,
            "groups": groups,
            "query": request.GET.urlencode(),
        },
    )


@login_required
@require_GET
def usage_csv(request):
    data, error = _usage_report(request)
    if error is not None:
        return error
    response = HttpResponse(usage.csv_text(data), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="usage-{data["from"]}-{data["to"]}.csv"'
    return response


# --- showback: every kind of use per user, class, group or image (what each viewer may see) ----


def _showback_report(request):
    try:
        first, last, by, filters = showback.filters_of(request.GET)
    except ValueError as exc:
        return None, None, HttpResponse(str(exc), status=400, content_type="text/plain")
    scope = showback.visible_usage(request.user)
    return showback.report(first, last, by=by, scope=scope, filters=filters), scope, None


@login_required
@require_GET
def showback_page(request):
    """Usage and cost per user, class, group or image: everyone sees what ``visible_usage`` lets them."""
    data, scope, error = _showback_report(request)
    if error is not None:
        return error
    images, groups = showback.choices(scope)
    return render(
        request,
        "reservations/showback.html",
        {
            "report": data,
            "scope": scope,
            "images": images,
            "groups": groups,
            "kinds": UsageRollup.Kind.choices,
            "groupings": showback.GROUPINGS,
            "query": request.GET.urlencode(),
            "dates": urlencode({"from": data["from"], "to": data["to"]}),
        },
    )


@login_required
@require_GET
def showback_csv(request):
    data, _, error = _showback_report(request)
    if error is not None:
        return error
    response = HttpResponse(showback.csv_text(data), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="usage-by-{data["by"]}-{data["from"]}-{data["to"]}.csv"'
    return response
