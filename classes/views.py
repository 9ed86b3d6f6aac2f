"""A course's page: where an LMS launch lands and where its members find their class.

Members see each class's next session and their seat; the course's instructors also the roster,
the classes' next sessions and the form that makes (POST to the page) or changes a class.
A course or class that is not the user's is a 404; writing without teaching it a 403.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from classes import services
from classes.forms import ClassForm, add_service_errors
from reservations.models import ApprovalRequest

MAX_ID = 2**63 - 1  # beyond the column's range: SQLite would raise instead of finding nothing


def _course(request, group_id):
    return get_object_or_404(services.courses(request.user), pk=min(group_id, MAX_ID))  # not yours: 404


@login_required
def course(request, group_id):
    group = _course(request, group_id)
    teaching = services.teaches(request.user, group)
    form = None
    if teaching:
        form = ClassForm(request.POST or None, user=request.user)
        if request.method == "POST" and form.is_valid():
            try:
                klass = services.create_class(actor=request.user, by=request.user, course=group, **form.cleaned_data)
            except ValidationError as exc:
                add_service_errors(form, exc)
            else:
                if isinstance(klass, ApprovalRequest):
                    messages.info(request, f"Waiting for approval: {klass.summary}. Nothing is reserved until then.")
                    return redirect("reservations:approval", pk=klass.pk)
                messages.success(request, f"Class {klass.name}: its sessions in the next weeks are reserved.")
                return redirect("classes:course", group_id=group.pk)
    elif request.method == "POST":
        raise PermissionDenied
    return render(request, "classes/course.html", _context(request, group, teaching, form))


def _context(request, group, teaching, form):
    now = timezone.now()
    classes = []
    for klass in services.visible_classes(request.user).filter(course=group).prefetch_related("sessions", "exceptions"):
        meeting, seat = services.next_seat(request.user, klass, now)
        usage = services.seat_counts(meeting) if meeting is not None else None
        upcoming = services.upcoming(klass, now) if teaching else []
        classes.append({"klass": klass, "meeting": meeting, "seat": seat, "usage": usage, "upcoming": upcoming})
    members = group.user_set.order_by("username") if teaching else None
    return {"course": group, "members": members, "classes": classes, "form": form, "teaching": teaching}


@login_required
def edit(request, group_id, pk):
    group = _course(request, group_id)
    klass = get_object_or_404(services.managed_classes(request.user).filter(course=group), pk=min(pk, MAX_ID))
    form = ClassForm(request.POST or None, user=request.user, initial=ClassForm.initial_of(klass))
    if request.method == "POST" and form.is_valid():
        try:
            services.change_class(klass, actor=request.user, by=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Class {klass.name} changed: its sessions not yet built are planned again.")
            return redirect("classes:course", group_id=group.pk)
    return render(request, "classes/class_edit.html", {"course": group, "klass": klass, "form": form})


@login_required
@require_POST
def delete(request, group_id, pk):
    group = _course(request, group_id)
    klass = get_object_or_404(services.managed_classes(request.user).filter(course=group), pk=min(pk, MAX_ID))
    dropped = services.delete_class(klass, actor=request.user)
    messages.success(request, f"Class {klass.name} deleted; {dropped} sessions to come canceled.")
    return redirect("classes:course", group_id=group.pk)
