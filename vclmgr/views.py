from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from vclmgr import dashboard, tokens
from vclmgr.forms import ApiTokenForm


@login_required
def home(request):
    """Everyone: their live activity. Staff also: the cluster dashboard (kept live by dashboard.js)."""
    context = {"dashboard": dashboard.gather()} if request.user.is_staff else {}
    return render(request, "home.html", context)


@login_required
def dashboard_data(request):
    """The dashboard's panels as JSON, for staff only (dashboard.js refetches it on events)."""
    if not request.user.is_staff:
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
    listed = request.user.api_tokens.all()
    return render(request, "tokens.html", {"form": form, "tokens": listed, "new_token": new_token})


@login_required
@require_POST
def revoke_api_token(request, token_id):
    if tokens.revoke(request.user, token_id):
        messages.success(request, "Token revoked.")
    return redirect("api-tokens")
