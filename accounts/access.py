"""Who may do what: roles, capabilities and token scopes. The one module that owns the rules.

Every view, API route, opcode and websocket topic asks this module, never ``is_staff``.

Roles are Django groups carrying Django permissions (``accounts.models.Access``'s): the role
groups ``instructor``, ``image-maintainer``, ``operator``, ``auditor`` and ``approver`` are made at migrate
time, but any group given one of those permissions in the admin carries the role too — so a
directory group mapped by ``AUTH_LDAP_GROUP_MAP`` / the OIDC claims onto a role group (or onto a
group that has the permission) gives the role at sign-in. ``admin`` is ``is_staff`` (or
superuser): it keeps meaning what it always meant.

Capabilities (``can(user, name)``):

- ``admin``: everything (``is_staff``).
- ``operate``: node states, evacuations, plans, verify, the job queue's tunables (operator).
  No user data: an operator's lists of VMs and reservations are their own.
- ``audit``: read everything, users' data included (auditor); changes nothing more than a
  plain user may (their own reservations).
- ``see_cluster``: read the operator pages (operate or audit).
- ``see_all``: read every user's reservations, VMs and jobs (audit).
- ``teach``: create and manage block allocations for the groups one is a member of
  (instructor), and see those blocks' reservations.
- ``maintain_images``: capture, publish and retire the images of one's groups.
- ``approve``: approve or deny the requests that wait for approval (a reservation of an image,
  a class, that requires it) of the members of one's groups (``APPROVERS_BY_GROUP``; off: of
  anyone), never one's own (``may_approve``).

"One's groups" there are ``own_groups``: a user's groups less the role groups (those named in
``ROLES`` and any carrying a role's permission). A role group gathers everyone holding the role,
so being in ``instructor`` is no licence to book every instructor's week.

API tokens have scopes (``read``, ``reserve``, ``run``, ``operate``, ``admin``); what a token
may do is its scopes ∩ what its user's roles allow, worked out at each request, so a user who
loses a role loses it on their tokens at once.
"""

import logging
from collections.abc import Callable

from django.contrib.auth.models import Group, Permission
from django.db.models import Q

from core.hooks import Hook

log = logging.getLogger(__name__)

#: role name → the capability permission it carries (codename of ``accounts.Access``)
ROLES = {
    "instructor": "teach",
    "image-maintainer": "maintain_images",
    "operator": "operate",
    "auditor": "audit",
    "approver": "approve",
}
ADMIN = "admin"
ALL_ROLES = [*ROLES, ADMIN]
PERMISSIONS = {
    "teach": "Instructor: block allocations for their groups",
    "maintain_images": "Image maintainer: capture, publish, retire their groups' images",
    "operate": "Operator: node states, evacuations, plans",
    "audit": "Auditor: read everything",
    "approve": "Approver: approve or deny requests that need approval",
}
_DERIVED = {"see_cluster": ("operate", "audit"), "see_all": ("audit",)}
CAPABILITIES = {ADMIN, *PERMISSIONS, *_DERIVED}

SCOPES = ["read", "reserve", "run", "operate", "admin"]
USER_SCOPES = {"read", "reserve", "run"}  # what any signed-in user may do on their own things


def is_admin(user):
    return bool(user is not None and user.is_authenticated and user.is_active and (user.is_staff or user.is_superuser))


def can(user, capability):
    """May ``user`` use ``capability`` (one of ``CAPABILITIES``)?"""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}")
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if is_admin(user):
        return True
    if capability == ADMIN:
        return False
    # has_perm caches the user's permissions on the user object: one query per request.
    return any(user.has_perm(f"accounts.{name}") for name in _DERIVED.get(capability, (capability,)))


def roles(user):
    """The user's roles, by name, in ``ALL_ROLES`` order."""
    return [name for name in ALL_ROLES if can(user, ROLES.get(name, ADMIN))]


# --- per object -----------------------------------------------------------------------


def role_groups():
    """The groups that give a role: the role groups, and any group carrying a role's permission
    (a directory group such as ``faculty`` given ``teach``)."""
    carries_a_role = Q(permissions__content_type__app_label="accounts", permissions__codename__in=PERMISSIONS)
    return Group.objects.filter(Q(name__in=ROLES) | carries_a_role)


def own_groups(user):
    """``user``'s groups that are a class or a team: their groups less the role groups."""
    return user.groups.exclude(pk__in=role_groups().values("pk"))


def visible(rows, user, public, owner_sees_inactive=False):
    """The rows of ``rows`` (images, environment templates: ``groups``, ``owner`` and ``active``
    fields) that ``user`` may use: all for staff; otherwise active ``public`` ones, their groups'
    and their own. An image maintainer also sees their groups' rows (inactive ones included) and
    the rows their groups' members own, which they may share with those groups.

    ``owner_sees_inactive``: the owner also sees their inactive rows (a template its owner
    switched off, to switch it on again); an inactive image stays out of its owner's list, as it
    always was, so what they may build from does not change."""
    if can(user, "see_all"):
        return rows.all()
    mine = public | Q(groups__in=user.groups.all())
    own = Q(owner=user) if user.pk is not None else Q(pk__in=[])
    if not owner_sees_inactive:
        mine |= own
    usable = Q(mine, active=True)
    if owner_sees_inactive:
        usable |= own
    if can(user, "maintain_images"):
        theirs = Q(groups__in=user.groups.all()) | Q(owner__groups__in=own_groups(user))
        return rows.filter(usable | theirs).distinct()
    return rows.filter(usable).distinct()


# Teaching is per course. A course whose membership a higher layer knows (an LMS course: lti
# fills this from the LMS's own membership roles) answers ``{group id: ids of the users who
# teach it}`` for the given group ids it knows; a group it leaves out is a local course, where
# a member holding the instructor role teaches it. (Without this, an Instructor of one LMS
# course would run every course they are a learner of.)
COURSE_TEACHERS: Hook[Callable[[list], dict[int, set[int]]]] = Hook("accounts.access.COURSE_TEACHERS", single=True)


def known_teachers(group_ids):
    """``COURSE_TEACHERS``' answer for ``group_ids``: ``{group id: its teachers' ids}`` of the
    courses among them whose teachers a higher layer knows."""
    group_ids = list(group_ids)
    fill = COURSE_TEACHERS.one()
    return fill(group_ids) if fill is not None and group_ids else {}


def taught_of(user, groups):
    """``groups`` (a queryset) less the courses known per course (``COURSE_TEACHERS``) that
    ``user`` does not teach."""
    known = known_teachers(groups.values_list("pk", flat=True))
    return groups.exclude(pk__in=[group for group, ids in known.items() if user.pk not in ids])


def teaching_groups(user):
    """The groups whose blocks ``user`` may create and manage: an instructor's own groups, less
    the LMS courses the LMS does not make them an Instructor of."""
    if is_admin(user):
        return Group.objects.all()
    return taught_of(user, own_groups(user)) if can(user, "teach") else Group.objects.none()


def holders(capability):
    """The users holding ``capability`` (one of ``PERMISSIONS``), as a ``Q`` on users: ``can``'s
    rule for many users in one statement (administrators, and the permission through a group or
    given to the user; an inactive user holds nothing)."""
    if capability not in PERMISSIONS:
        raise ValueError(f"not a role's capability: {capability!r}")
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    permission = Permission.objects.filter(content_type__app_label="accounts", codename=capability)
    through_group = users.filter(groups__permissions__in=permission).values("pk")
    own = users.filter(user_permissions__in=permission).values("pk")
    held = Q(is_staff=True) | Q(is_superuser=True) | Q(pk__in=through_group) | Q(pk__in=own)
    return Q(is_active=True) & held


def can_manage_block(user, block):
    if is_admin(user):
        return True
    return teaching_groups(user).filter(pk=block.group_id).exists()


def maintained_groups(user):
    """The groups whose images ``user`` may capture into, publish and retire (admin: all)."""
    if is_admin(user):
        return Group.objects.all()
    return own_groups(user) if can(user, "maintain_images") else Group.objects.none()


def shareable_groups(user):
    """The groups ``user`` may share an image with: their maintained groups that are a class or a
    team (a group that gives a role, such as ``operator``, is not an audience)."""
    return maintained_groups(user).exclude(pk__in=role_groups().values("pk"))


def can_maintain_image(user, image):
    """An image is a maintainer's when one of its groups is theirs (a public image with no
    group is the administrators')."""
    if is_admin(user):
        return True
    return can(user, "maintain_images") and image.groups.filter(pk__in=own_groups(user).values("pk")).exists()


def may_share_image(user, image):
    """Administrators share any image; an image maintainer one of their groups' images, or one
    a member of their groups owns (a capture, shared with the class by its maintainer)."""
    if is_admin(user):
        return True
    if not can(user, "maintain_images"):
        return False
    owner_is_ours = image.owner_id is not None and own_groups(user).filter(user=image.owner_id).exists()
    return owner_is_ours or can_maintain_image(user, image)


def check_image_sharing(user, image, groups):
    """Refuse (PermissionDenied) unless ``user`` may share ``image`` with ``groups``: a
    maintainer gives only their own groups (``maintained_groups``)."""
    from django.core.exceptions import PermissionDenied

    if not may_share_image(user, image):
        log.info("image sharing refused to %s (image %s)", user, image.pk)
        raise PermissionDenied("only an image maintainer of the owner's groups may share this image")
    chosen = {getattr(g, "pk", g) for g in groups}
    if not chosen <= set(maintained_groups(user).values_list("pk", flat=True)):
        raise PermissionDenied("share an image only with your own groups")


def shared_groups(user, row, groups):
    """The groups ``row`` (an image, an environment template) is to be restricted to when
    ``user`` shares it with ``groups``: those, and the row's groups that are not ``user``'s to
    give or take. Refused (PermissionDenied: ``check_image_sharing``; ValidationError: a group
    that gives a role, not an audience)."""
    from django.core.exceptions import ValidationError

    check_image_sharing(user, row, groups)
    roles = role_groups().filter(pk__in=[getattr(g, "pk", g) for g in groups])
    if roles.exists():
        names = ", ".join(sorted(roles.values_list("name", flat=True)))
        raise ValidationError({"groups": [f"{names} gives a role, not an audience: share with a class or team"]})
    mine = set(maintained_groups(user).values_list("pk", flat=True))
    kept = {pk for pk in row.groups.values_list("pk", flat=True) if pk not in mine}
    return sorted(kept | {getattr(g, "pk", g) for g in groups})


def check_image_ownership(user, image):
    """Refuse (PermissionDenied) unless ``user`` may rename or delete ``image``: its owner, or
    whoever may change it anyway (``check_image_maintenance``)."""
    if image.owner_id is not None and image.owner_id == getattr(user, "pk", None) and user.is_active:
        return
    check_image_maintenance(user, image)


def capture_access(user, parent):
    """``(visibility, group ids)`` of an image ``user`` captures from a VM of ``parent``.

    Administrators (and the system, ``user`` None) keep the parent's. An image maintainer's
    capture is restricted to their groups among the parent's — or, from an image none of their
    groups owns (a public one), to their own groups: what ``check_image_maintenance`` lets them
    give an image by hand, so a maintainer never makes a public or group-less image and what
    they capture stays theirs to publish or retire. Anyone else's (a maintainer with no group
    of their own too) is restricted with no group: its owner's (the image's ``owner``) and the
    administrators' until a maintainer of the owner's groups shares it, so a VM's contents never
    reach other users on their own.
    """
    restricted = type(parent).Visibility.RESTRICTED
    if user is None or is_admin(user):
        return parent.visibility, list(parent.groups.values_list("pk", flat=True))
    mine = maintained_groups(user).values_list("pk", flat=True)
    groups = list(parent.groups.filter(pk__in=mine).values_list("pk", flat=True))
    if not groups and parent.visibility != restricted:
        groups = list(mine)
    return restricted, sorted(groups)


# --- approvals ----------------------------------------------------------------------------


def approver_scope(user):
    """The groups whose members' requests ``user`` may decide: None for any (administrators, and
    approvers when ``APPROVERS_BY_GROUP`` is off), their own groups, or none at all."""
    from django.conf import settings

    if is_admin(user):
        return None
    if not can(user, "approve"):
        return Group.objects.none()
    return own_groups(user) if settings.APPROVERS_BY_GROUP else None


def may_approve(user, requester_id, requester_groups):
    """May ``user`` decide a request of ``requester_id`` (a member of ``requester_groups``, ids)?
    Never their own: a request is approved by someone else (administrators included)."""
    if user is None or not user.is_authenticated or requester_id == user.pk:
        return False
    if not (is_admin(user) or can(user, "approve")):
        return False
    scope = approver_scope(user)
    return scope is None or scope.filter(pk__in=list(requester_groups)).exists()


def approvers_for(requester):
    """The active users who may decide a request of ``requester`` (whom it is announced to)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    users = get_user_model().objects.filter(is_active=True).exclude(pk=requester.pk)
    perm = Q(groups__permissions__codename="approve", groups__permissions__content_type__app_label="accounts")
    perm |= Q(user_permissions__codename="approve", user_permissions__content_type__app_label="accounts")
    approvers = users.filter(perm)
    if settings.APPROVERS_BY_GROUP:
        approvers = approvers.filter(groups__in=own_groups(requester))
    admins = users.filter(Q(is_staff=True) | Q(is_superuser=True))
    return users.filter(Q(pk__in=approvers.values("pk")) | Q(pk__in=admins.values("pk"))).order_by("pk")


# --- API tokens -----------------------------------------------------------------------


def allowed_scopes(user):
    """The scopes a token of ``user`` may use now (their roles decide)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return set()
    allowed = set(USER_SCOPES)
    if can(user, "operate"):
        allowed.add("operate")
    if is_admin(user):
        allowed.add("admin")
    return allowed


def effective_scopes(token):
    return set(token.scopes) & allowed_scopes(token.user)


def token_permits(request, scope, what=""):
    """Does the request's API token (if it came with one) carry ``scope`` now? A refusal is logged
    with the token's prefix and name (never the token)."""
    from accounts.models import ApiToken

    token = getattr(request, "auth", None)
    if not isinstance(token, ApiToken):
        return True
    return token_has(token, scope, what or getattr(request, "path", "?"))


def token_has(token, scope, what):
    """Does ``token`` carry ``scope`` now (its scopes ∩ its user's)? A refusal is logged."""
    if scope in effective_scopes(token):
        return True
    log.warning(
        "API token %s… (%r) of %s refused: %s needs scope %r, it has %s",
        token.prefix,
        token.name,
        token.user,
        what,
        scope,
        sorted(effective_scopes(token)),
    )
    return False


# --- assigning roles --------------------------------------------------------------------


def role_group(name):
    """The role's group, made (with its permission) if missing."""
    from django.contrib.contenttypes.models import ContentType

    from accounts.models import Access

    codename = ROLES[name]
    ct = ContentType.objects.get_for_model(Access, for_concrete_model=False)
    perm, _ = Permission.objects.get_or_create(
        content_type=ct, codename=codename, defaults={"name": PERMISSIONS[codename]}
    )
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.add(perm)
    return group


def ensure_roles(**kwargs):
    """post_migrate: every role group exists with its permission."""
    for name in ROLES:
        role_group(name)


def set_roles(user, wanted, *, actor):
    """Give ``user`` exactly the ``wanted`` roles (``admin`` is ``is_staff``), recorded in the
    change log. A role a user has through another group (a directory group with the permission)
    stays: take it from that group instead."""
    from django.core.exceptions import ValidationError
    from django.db import transaction

    from core import changelog

    unknown = sorted(set(wanted) - set(ALL_ROLES))
    if unknown:
        raise ValidationError({"roles": [f"unknown role {unknown[0]!r}; roles are {', '.join(ALL_ROLES)}"]})
    before = roles(type(user).objects.get(pk=user.pk))
    with transaction.atomic():
        for name in ROLES:
            group = role_group(name)
            (user.groups.add if name in wanted else user.groups.remove)(group)
        if (ADMIN in wanted) != user.is_staff:
            user.is_staff = ADMIN in wanted
            user.save(update_fields=["is_staff"])
        forget_permissions(user)
        after = roles(user)
        if after != before:
            changelog.record(user, "update", changelog.Actor.of(actor), {"roles": [before, after]})
    return after


def grant_role(users, name, *, actor):
    """Add ``name`` (one of ``ROLES``) to the roles of ``users`` (one user or several),
    recorded in the change log: those not holding it join that role's group and no other.
    (``set_roles`` sets them all, which would make a role held only through a directory group a
    membership of its role group, outliving the directory group.) A few statements however many
    users: one per role to read, one to add, one to record. Returns the users who gained it."""
    from core import changelog

    if name not in ROLES:
        raise ValueError(f"not a role: {name!r}")
    users = [users] if hasattr(users, "pk") else list(users)
    if not users:
        return []
    found = type(users[0]).objects.filter(pk__in=[user.pk for user in users])
    held = {role: set(found.filter(holders(ROLES[role])).values_list("pk", flat=True)) for role in ROLES}
    gaining = [user for user in users if user.pk not in held[name]]
    if gaining:
        role_group(name).user_set.add(*gaining)
        entries = []
        for user in gaining:
            admin = [ADMIN] if user.is_staff or user.is_superuser else []
            before = [role for role in ROLES if user.pk in held[role]] + admin
            after = [role for role in ROLES if user.pk in held[role] or role == name] + admin
            entries.append((user, "update", {"roles": [before, after]}))
        changelog.record_many(entries, actor=actor)
    for user in users:
        forget_permissions(user)
    return gaining


def forget_permissions(user):
    """Drop the permissions ModelBackend cached on this user object (after a role change)."""
    for cache in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(cache, None)


class Capabilities:
    """``{% if can.operate %}`` in templates."""

    def __init__(self, user):
        self.user = user

    def __getitem__(self, name):
        if name not in CAPABILITIES:
            raise KeyError(name)
        return can(self.user, name)


def context(request):
    """Template context processor: ``can`` (capabilities of the signed-in user)."""
    return {"can": Capabilities(getattr(request, "user", None))}


# --- pages ------------------------------------------------------------------------------


def page(*, read, write):
    """Decorator for a function view: a read (GET, HEAD) needs ``read``, anything else ``write``.
    Not signed in: the login page; signed in without the capability: 403."""
    from functools import wraps

    from django.contrib.auth.decorators import login_required
    from django.core.exceptions import PermissionDenied

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            needed = read if request.method in ("GET", "HEAD", "OPTIONS") else write
            if not can(request.user, needed):
                log.info("%s %s refused to %s: needs %s", request.method, request.path, request.user, needed)
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


#: the operator pages (hosts, chassis, plans, verify): operators and auditors read, operators act
operator_page = page(read="see_cluster", write="operate")


def check_image_maintenance(user, image=None, groups=None):
    """Refuse (PermissionDenied) unless ``user`` may change ``image`` (None: make a new one) and
    give it ``groups`` (None: unchanged). A maintainer's image keeps at least one of their groups,
    so what they publish stays theirs to retire; only administrators make group-less images."""
    from django.core.exceptions import PermissionDenied

    if is_admin(user):
        return
    if not can(user, "maintain_images") or (image is not None and not can_maintain_image(user, image)):
        log.info("image change refused to %s (image %s)", user, getattr(image, "pk", "new"))
        raise PermissionDenied("only an image maintainer of the image's groups may change it")
    if groups is not None or image is None:
        mine = set(maintained_groups(user).values_list("pk", flat=True))
        chosen = {getattr(g, "pk", g) for g in (groups or ())}
        if not chosen or not chosen <= mine:
            raise PermissionDenied("give the image one or more of your own groups, and only those")
