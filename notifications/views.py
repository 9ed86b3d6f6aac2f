from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render

from notifications import services
from notifications.models import KINDS


@login_required
def preferences(request):
    """Your e-mail notifications: tick the kinds you want."""
    if request.method == "POST":
        wanted = set(request.POST.getlist("kinds"))
        try:
            services.set_preferences(request.user, [k for k, _ in KINDS if k not in wanted], actor=request.user)
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
        else:
            messages.success(request, "Notification preferences saved.")
        return redirect("notification-preferences")
    off = set(services.disabled_kinds(request.user))
    rows = [{"name": name, "label": label, "on": name not in off} for name, label in KINDS]
    return render(request, "notifications/preferences.html", {"kinds": rows})
