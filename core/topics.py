"""Who may subscribe to which event topic.

A topic is a dotted name: ``user.<id>`` (a user's own reservations and jobs), ``admin``
(the dashboard), or one an app registers in ``AUTHORISERS`` (``job.<id>``, ``hypervisor.<id>`` …).
Each prefix maps to an authoriser ``(user, rest) -> bool``; a topic whose prefix nobody
registered is refused. Authorisers run the ORM: call them from async code through
``database_sync_to_async``.

Roles are the accounts app's (``accounts.access.can``), a layer above: it fills ``ROLE_CHECK``
at start-up. Until it has, every topic that needs a role is refused.
"""

import re
from collections.abc import Callable

from core.hooks import Hook

# prefix -> ``authoriser(user, rest) -> bool``: each app its topics, in its AppConfig.ready().
AUTHORISERS: Hook[Callable[..., bool]] = Hook("core.topics.AUTHORISERS", keyed=True, single=True)
# ``can(user, capability) -> bool`` answers for the authorisers below (accounts fills it).
ROLE_CHECK: Hook[Callable[..., bool]] = Hook("core.topics.ROLE_CHECK", single=True)
TOPIC_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


def _can(user, capability):
    can = ROLE_CHECK.one()
    return can is not None and can(user, capability)


def staff_only(user, rest):
    """Administrators only."""
    return _can(user, "admin")


def cluster_readers(user, rest):
    """The cluster's topics (hosts, chassis, plans, the dashboard): operators and auditors."""
    return _can(user, "see_cluster")


def everything_readers(user, rest):
    """Topics with users' data: auditors (and administrators)."""
    return _can(user, "see_all")


def may_subscribe(user, topic):
    if not user.is_authenticated or not TOPIC_RE.match(topic) or len(topic) > 80:
        return False
    prefix, _, rest = topic.partition(".")
    authoriser = AUTHORISERS.one(prefix)
    return bool(authoriser and authoriser(user, rest))


def _own_user_topic(user, rest):
    return rest == str(user.pk) or _can(user, "see_all")


def register_builtin_topics():
    AUTHORISERS.register("user", _own_user_topic)
    AUTHORISERS.register("admin", cluster_readers)


def user_topic(user_or_id):
    return f"user.{getattr(user_or_id, 'pk', user_or_id)}"
