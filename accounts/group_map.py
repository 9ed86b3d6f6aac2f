"""Directory memberships → vclmgr groups: the one mapping every sign-on method uses (LDAP's
``AUTH_LDAP_GROUP_MAP``, SAML's ``SAML_GROUP_MAP``, OpenID Connect's ``OIDC_GROUP_MAP`` as the
value map of its groups claim).

A map is a JSON object: an attribute name → an object of that attribute's values → a group
name (or a list of them); for LDAP also a group DN → group name(s)::

    {"eduPersonAffiliation": {"faculty": "staff-images", "student": ["students"]},
     "cn=cs101,ou=groups,dc=campus,dc=example": "cs101"}

At each sign-in the user is put in exactly the mapped groups its attributes give, among the
groups the map can give; groups the map does not name (given by hand) stay. Quotas and image
visibility follow Django groups, so they change at that sign-in.

Safe to import from settings.py (``attribute_map_errors``): models are imported where used.
"""

import logging

from django.db import transaction

log = logging.getLogger("accounts.signon")


def names_ok(value):
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v.strip() for v in value)


def value_map_errors(key, target):
    """Why ``key: target`` is not an attribute → {value: group name(s)} entry (or None)."""
    if not isinstance(target, dict):
        return f"{key!r} must map to an object of its values → group name(s)"
    if "=" in key or not key.strip():
        return f"{key!r}: an object maps the values of one attribute, and {key!r} is not an attribute name"
    bad = [v for v, names in target.items() if not names_ok(names)]
    if bad:
        return f"{key!r}: {bad[0]!r} must map to a group name or a list of them"
    return None


def attribute_map_errors(value):
    """A check for ``Env.json``: a map of attribute values only (no group DNs)."""
    if not isinstance(value, dict):
        return 'expected a JSON object: attribute → {value: group}, e.g. {"eduPersonAffiliation": {"faculty": "staff"}}'
    for key, target in value.items():
        problem = value_map_errors(key, target)
        if problem:
            return problem
    return None


def normal_dn(dn):
    import ldap.dn

    return ldap.dn.dn2str([[(k.lower(), v.lower(), t) for k, v, t in rdn] for rdn in ldap.dn.str2dn(dn)])


def _names(target):
    return [target] if isinstance(target, str) else list(target)


def managed_groups(group_map):
    """Every group name the map can give: the groups a sign-in may take away."""
    out = set()
    for target in group_map.values():
        for names in target.values() if isinstance(target, dict) else [target]:
            out.update(_names(names))
    return out


def mapped_groups(group_map, group_dns, attrs):
    """The group names the map gives a user with these (normalised) group DNs and attributes."""
    lowered = {name.lower(): values for name, values in attrs.items()}
    out = set()
    for key, target in group_map.items():
        if isinstance(target, dict):
            have = {str(v).casefold() for v in lowered.get(key.lower(), [])}
            for value, names in target.items():
                if value.casefold() in have:
                    out.update(_names(names))
        elif normal_dn(key) in group_dns:
            out.update(_names(target))
    return out


@transaction.atomic
def set_mapped_groups(user, wanted, *, managed, source):
    """Put ``user`` in exactly the ``wanted`` ones of the ``managed`` groups; others stay.
    ``source`` names the sign-on method in the change log ("LDAP", "SAML", "OIDC")."""
    from django.contrib.auth.models import Group

    from core import changelog

    current = set(user.groups.values_list("name", flat=True))
    add, remove = wanted - current, (managed - wanted) & current
    if not add and not remove:
        return
    for name in sorted(add):
        Group.objects.get_or_create(name=name)
    user.groups.add(*Group.objects.filter(name__in=add))
    user.groups.remove(*Group.objects.filter(name__in=remove))
    changes = {"groups": [sorted(current), sorted((current | add) - remove)]}
    changelog.record(user, "update", changelog.Actor(name="directory"), changes, reason=f"{source} sign-in")
    log.info("%s sign-in of %s: groups +%s -%s", source, user, sorted(add), sorted(remove))
