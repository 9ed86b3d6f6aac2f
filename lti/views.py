"""The tool's three endpoints an LMS calls (login initiation, launch, JWKS) and an instructor's
roster sync. Login and launch come from the platform's site: they are CSRF-exempt (the OIDC
state cookie and the signed, single-use ID token are their proof) and answer refusals with the
error page; every verb is in ``lti.services``."""

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from classes import services as classes
from core.errors import Conflict
from lti import services


def _refused(request, exc):
    services.log.warning("LTI refused from %s: %s", request.META.get("REMOTE_ADDR"), exc.reason)
    return render(request, "lti/error.html", {"reason": exc.reason}, status=exc.status)


@csrf_exempt
@require_http_methods(["GET", "POST"])
def oidc_login(request):
    params = request.POST if request.method == "POST" else request.GET
    try:
        return services.login_redirect(request, params)
    except services.LaunchRefused as exc:
        return _refused(request, exc)


@csrf_exempt
@require_POST
def launch(request):
    try:
        user, group = services.launch(request)
    except services.LaunchRefused as exc:
        return _refused(request, exc)
    # The platform vouched for the user (a signed launch): no password, so no lockout to count.
    login(request, user, backend="lti.backends.LaunchBackend")
    return redirect(reverse("classes:course", kwargs={"group_id": group.pk}))


@require_GET
def jwks(request):
    return JsonResponse(services.jwks())


@login_required
@require_POST
def sync_roster(request, group_id):
    group = get_object_or_404(classes.courses(request.user), pk=group_id)
    course = services.course_of(group)
    if course is None or not classes.teaches(request.user, group):
        raise Http404
    try:
        result = services.sync_roster(course, actor=request.user)
    except Conflict as exc:
        messages.error(request, f"Roster not synced: {exc}")
    else:
        text = f"Roster synced from the LMS: {len(result['added'])} added, {len(result['removed'])} removed."
        if result["skipped"]:
            text += f" Skipped (disabled or administrators' accounts): {', '.join(result['skipped'])}."
        messages.success(request, text)
    return redirect(reverse("classes:course", kwargs={"group_id": group.pk}))


def course_card(request, group):
    """The LMS roster card of a course's page, for its instructors (None: not an LMS course,
    or not theirs to run)."""
    course = services.course_of(group)
    if course is None or not classes.teaches(request.user, group):
        return None
    return {"template": "lti/course_card.html", "lti_course": course}
