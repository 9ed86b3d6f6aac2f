"""Each page request runs in its user's time zone (``accounts.preferences``); the API in UTC.

Django converts aware datetimes to the active zone when a template shows them and reads a form's
naive input in it, so activating the zone here is what makes pages and forms local. The API and
Ganeti's RAPI are for programs: they answer ISO 8601 with a UTC offset and read a datetime sent
without one as UTC, whoever asks (DRF's DateTimeField uses the active zone for both).
"""

from datetime import UTC

from django.utils import timezone

from accounts import preferences
from core import localtime

#: Paths of machine interfaces: UTC whatever the user's or the site's zone.
MACHINE_PATHS = ("/api/", "/2/", "/version")


class TimeZoneMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info.startswith(MACHINE_PATHS):
            zone = UTC
        else:
            zone = localtime.zone(self.zone_name(request), "UTC")
        with timezone.override(zone):
            return self.get_response(request)

    @staticmethod
    def zone_name(request):
        browser = request.COOKIES.get(preferences.COOKIE, "")
        browser = browser if localtime.is_zone(browser) else ""
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return preferences.effective("", browser)
        chosen, kept = preferences.stored(user)
        if browser and browser != kept:
            preferences.note_browser_zone(user, browser)
        return preferences.effective(chosen, browser or kept)
