"""A course's page: where an LMS launch lands and where its members find their class.

Members see each class's next session and their seat; the course's instructors also the roster,
the classes' next sessions and the form that makes (POST to the page) or changes a class.
Each class's hours budget (``classes.budget``): a student sees their own hours, its
instructors every student's and the form that grants extra hours (``grant``).
A course or class that is not the user's is a 404; writing without teaching it a 403.
"""

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from classes import budget, services
from classes.forms import ClassForm, GrantForm, add_service_errors
from core.hooks import Hook
from reservations.models import ApprovalRequest

# Cards of the layers above on the course page (lti: the LMS roster sync), filled in their
# ready(): ``(request, group) -> context`` with the card's ``template``, or None (no card).
COURSE_CARDS: Hook[Callable] = Hook("classes.views.COURSE_CARDS")


def _course(request, group_id):
    return get_object_or_404(services.courses(request.user), pk=group_id)  # not yours: 404


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
    studied = set(budget.studied(request.user).filter(course=group).values_list("pk", flat=True))
    for klass in services.visible_classes(request.user).filter(course=group).prefetch_related("sessions", "exceptions"):
        meeting, seat = services.next_seat(request.user, klass, now)
        usage = services.seat_counts(meeting) if meeting is not None else None
        upcoming = services.upcoming(klass, now) if teaching else []
        entry = {"klass": klass, "meeting": meeting, "seat": seat, "usage": usage, "upcoming": upcoming}
        classes.append({**entry, **_budget(request.user, klass, teaching, studied)})
    members = group.user_set.order_by("username") if teaching else None
    cards = [card for card in (make(request, group) for make in COURSE_CARDS) if card]
    return {"course": group, "members": members, "classes": classes, "form": form, "teaching": teaching, "cards": cards}


def _budget(user, klass, teaching, studied):
    """The class's hours budget as the page shows it: every student's to its instructors, with
    the grant form; a student's own to them."""
    if teaching:
        students = budget.students(klass)
        listed = list(students)
        rows = list(zip(listed, budget.roster(klass, listed), strict=True))
        # One form per class on the page: ids of their own.
        return {"budget_rows": rows, "grant_form": GrantForm(students=students, auto_id=f"id_grant{klass.pk}_%s")}
    if klass.pk in studied:
        return {"my_budget": budget.standing(user, klass)}
    return {}


@login_required
@require_POST
def grant(request, group_id, pk):
    group = _course(request, group_id)
    klass = get_object_or_404(services.managed_classes(request.user).filter(course=group), pk=pk)
    form = GrantForm(request.POST, students=budget.students(klass))
    if form.is_valid():
        data = form.cleaned_data
        try:
            budget.grant_hours(
                klass, data["student"], data["hours"], data["reason"], actor=request.user, by=request.user
            )
        except ValidationError as exc:
            messages.error(request, "Not granted: " + " ".join(exc.messages))
        else:
            messages.success(request, f"{budget.plural(data['hours'])} granted to {data['student'].get_username()}.")
    else:
        messages.error(request, "Not granted: " + " ".join(m for ms in form.errors.values() for m in ms))
    return redirect(f"{reverse('classes:course', args=[group.pk])}#budget-{klass.pk}")


@login_required
def edit(request, group_id, pk):
    group = _course(request, group_id)
    klass = get_object_or_404(services.managed_classes(request.user).filter(course=group), pk=pk)
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
    klass = get_object_or_404(services.managed_classes(request.user).filter(course=group), pk=pk)
    dropped = services.delete_class(klass, actor=request.user)
    messages.success(request, f"Class {klass.name} deleted; {dropped} sessions to come canceled.")
    return redirect("classes:course", group_id=group.pk)
