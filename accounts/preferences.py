"""A user's time zone: the one they chose, else the one their browser reported, else the site's.

Pages, forms and e-mails show and read times in it (``accounts.middleware`` activates it for each
page request; ``zone_of`` is for work outside a request, such as an e-mail to its recipient). The
API is not affected: it speaks UTC with offsets whoever asks.

The browser reports its zone in the ``COOKIE`` that ``static/js/timezone.js`` sets; it is kept
(``browser_time_zone``) so that e-mails use it too. Every page request needs the pair, so it is
cached by user (the cache is shared by every process), filled at sign-in; a change deletes the
entry.
"""

import logging

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction

from accounts.models import Preferences
from core import changelog, localtime
from core.changelog import Actor

log = logging.getLogger(__name__)

COOKIE = "vclmgr_tz"
CACHE_SECONDS = 24 * 3600


def _key(user):
    # The join time too: a database made anew (tests, a re-installed site) reuses ids, and the
    # cache (a file or Redis) outlives it.
    joined = user.date_joined.timestamp() if getattr(user, "date_joined", None) else 0
    return f"accounts:time_zone:{user.pk}:{joined:.6f}"


def stored(user):
    """``(chosen, browser)`` zone names of ``user`` (blank: none), from the cache if there."""
    try:
        pair = cache.get(_key(user))
    except Exception:  # the cache (Redis) is down: pages go on from the database
        log.warning("time zone cache unreadable; reading the database", exc_info=True)
        pair = None
    if pair is None:
        row = Preferences.objects.filter(user=user).values_list("time_zone", "browser_time_zone").first()
        pair = tuple(row or ("", ""))
        _remember(user, pair)
    return tuple(pair)


def _remember(user, pair):
    try:
        cache.set(_key(user), tuple(pair), CACHE_SECONDS)
    except Exception:  # the cache (Redis) is down: the next request reads the database again
        log.warning("time zone cache unwritable", exc_info=True)


def effective(chosen="", browser=""):
    """The zone name to use: the chosen one, else the browser's, else ``settings.TIME_ZONE``."""
    return next((name for name in (chosen, browser) if localtime.is_zone(name)), settings.TIME_ZONE)


def zone_name(user):
    """The name of the zone ``user``'s pages and e-mails use."""
    if user is None or not user.is_authenticated:
        return settings.TIME_ZONE
    return effective(*stored(user))


def zone_of(user):
    """The ``ZoneInfo`` of ``zone_name(user)``."""
    return localtime.zone(zone_name(user), settings.TIME_ZONE)


def set_time_zone(user, name, *, actor):
    """Choose ``user``'s zone (blank: none chosen, so their browser's or the site's applies)."""
    actor = Actor.of(actor)
    name = (name or "").strip()
    if name and not localtime.is_zone(name):
        raise ValidationError({"time_zone": [f"{name!r} is not a time zone name such as Europe/Berlin"]})
    with transaction.atomic():
        row, _ = Preferences.objects.select_for_update().get_or_create(user=user)
        before = row.time_zone
        if before != name:
            row.time_zone = name
            row.save(update_fields=["time_zone"])
            changelog.record(row, "update", actor, changes={"time_zone": [before, name]})
        _forget(user)
    return row


def note_browser_zone(user, name):
    """Keep the zone ``user``'s browser reported, if it is a zone and a new one. Not a choice:
    a chosen zone still wins, and nothing is logged (it follows the user's laptop around)."""
    if not localtime.is_zone(name):
        return False
    chosen, browser = stored(user)
    if browser == name:
        return False
    try:
        with transaction.atomic():
            Preferences.objects.update_or_create(user=user, defaults={"browser_time_zone": name})
    except DatabaseError:  # a page is not refused for this: the next request tries again
        log.warning("browser time zone of user %s not kept", user.pk, exc_info=True)
        return False
    _remember(user, (chosen, name))
    return True


def on_login(sender, request, user, **kwargs):
    """At sign-in (Django's ``user_logged_in``): read the pair into the cache and keep the
    browser's zone, so the pages that follow cost no query for it."""
    browser = request.COOKIES.get(COOKIE, "") if request is not None else ""
    if not note_browser_zone(user, browser):
        stored(user)


def _forget(user):
    def drop():
        try:
            cache.delete(_key(user))
        except Exception:  # the cache (Redis) is down: its entry expires within CACHE_SECONDS
            log.warning("time zone cache entry of user %s not deleted", user.pk, exc_info=True)

    drop()
    transaction.on_commit(drop)  # and again after commit, so no request re-caches the old value
