from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts import access, tokens
from accounts.forms import ApiTokenForm
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


@login_required
def dashboard_data(request):
    """The dashboard's panels as JSON, for staff only (dashboard.js refetches it on events)."""
    if not access.can(request.user, "see_cluster"):
        raise PermissionDenied
    response = JsonResponse(dashboard.gather())
    response["Cache-Control"] = "no-store"
    return response


@login_required
def api_tokens(request):
    """List your tokens and create one; a new token is shown on this response only."""
    form = ApiTokenForm(request.POST or None, user=request.user)
    new_token = None
    if request.method == "POST" and form.is_valid():
        _, new_token = tokens.issue(request.user, **form.cleaned_data)
        form = ApiTokenForm(user=request.user)
    listed = list(request.user.api_tokens.all())
    for token in listed:
        token.effective = access.effective_scopes(token)
    return render(request, "tokens.html", {"form": form, "tokens": listed, "new_token": new_token})


@login_required
@require_POST
def revoke_api_token(request, token_id):
    if tokens.revoke(request.user, token_id):
        messages.success(request, "Token revoked.")
    return redirect("api-tokens")
