"""A user's API token pages (sign-in itself is ``accounts.signon``)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts import access, tokens
from accounts.forms import ApiTokenForm


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
