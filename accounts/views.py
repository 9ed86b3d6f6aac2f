"""Sign-in and sign-out pages (the rules are ``accounts.signon``), a user's account page (their
time zone) and API token pages."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts import access, preferences, tokens
from accounts.forms import ApiTokenForm, TimeZoneForm
from accounts.signon import LoginForm, methods


@login_required
def account(request):
    """Your account: the time zone pages, forms and e-mails use."""
    chosen, browser = preferences.stored(request.user)
    form = TimeZoneForm(request.POST or None, initial={"time_zone": chosen}, browser_zone=browser)
    if request.method == "POST" and form.is_valid():
        try:
            preferences.set_time_zone(request.user, form.cleaned_data["time_zone"], actor=request.user)
        except ValidationError as exc:
            form.add_error("time_zone", exc.message_dict["time_zone"])
        else:
            messages.success(request, f"Time zone: {preferences.zone_name(request.user)}.")
            return redirect("account")
    now = timezone.localtime()
    return render(request, "account.html", {"form": form, "zone": timezone.get_current_timezone_name(), "now": now})


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


class LoginView(auth_views.LoginView):
    authentication_form = LoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return super().get_context_data(sign_on_methods=methods(), **kwargs)


class LogoutView(auth_views.LogoutView):
    """Sign-out; a session from a SAML sign-in also signs out at the IdP (accounts/saml.py)."""

    def post(self, request, *args, **kwargs):
        if settings.SAML_ENABLED:
            from accounts import saml

            if saml.signed_on(request):
                response = saml.logout(request)
                if response is not None:
                    return response
        return super().post(request, *args, **kwargs)
