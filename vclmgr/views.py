"""The site's home page: everyone's own activity, or the cluster dashboard for who may see it."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from accounts import access
from monitoring import dashboard
from reservations import home as user_home
from runs import home as run_home


@login_required
def home(request):
    """Everyone: their live activity. Staff: the cluster dashboard (kept live by dashboard.js); others:
    their reservations and classes with the next action (refreshed on their events by home.js)."""
    if access.can(request.user, "see_cluster"):
        context = {"dashboard": dashboard.gather()}
    else:
        context = {"mine": _mine(request.user)}
    return render(request, "home.html", context)


def _mine(user):
    return {**user_home.for_user(user), "runs": run_home.runs_of(user)}


@login_required
@require_GET
def home_panel(request):
    """The home page's own reservations, classes and runs (an htmx fragment, refreshed on events)."""
    return render(request, "reservations/_home.html", _mine(request.user))
