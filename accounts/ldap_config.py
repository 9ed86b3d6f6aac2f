"""LDAP / Active Directory sign-on settings, read from the environment (docs/admin/sign-on.md, "LDAP").

``ldap_settings(env)`` returns the ``AUTH_LDAP_*`` Django settings django-auth-ldap reads, under
the library's own names so that its documentation applies, or ``{}`` when
``AUTH_LDAP_SERVER_URI`` is unset (LDAP off). Safe to call from settings.py: it imports only
python-ldap and ``django_auth_ldap.config`` (which never touches the app registry).

``AUTH_LDAP_GROUP_MAP`` (vclmgr's own) says which directory memberships put a user in which
vclmgr group, as JSON: a group DN → a group name (or a list), or an attribute name → an object
of its values → group names::

    {"cn=cs101,ou=groups,dc=campus,dc=example": "cs101",
     "eduPersonAffiliation": {"faculty": "staff-images", "student": ["students"]}}
"""

from django.core.exceptions import ImproperlyConfigured

from accounts.group_map import names_ok, value_map_errors

# AUTH_LDAP_GROUP_TYPE: netbox-docker's class names, also without "Type" and in any case.
_GROUP_TYPES = (
    "PosixGroupType",
    "GroupOfNamesType",
    "NestedGroupOfNamesType",
    "GroupOfUniqueNamesType",
    "NestedGroupOfUniqueNamesType",
    "ActiveDirectoryGroupType",
    "NestedActiveDirectoryGroupType",
    "OrganizationalRoleGroupType",
    "NestedOrganizationalRoleGroupType",
    "MemberDNGroupType",
    "NestedMemberDNGroupType",
)
_DEFAULT_ATTR_MAP = {"first_name": "givenName", "last_name": "sn", "email": "mail"}
_USER_FIELDS = {"first_name", "last_name", "email"}


def ldap_settings(env):
    uri = env.str("AUTH_LDAP_SERVER_URI", "").strip()
    if not uri:
        return {}
    import ldap
    from django_auth_ldap import config

    for one in uri.split():
        if not one.startswith(("ldap://", "ldaps://", "ldapi://")):
            raise ImproperlyConfigured(f"AUTH_LDAP_SERVER_URI: {one!r} is not an ldap://, ldaps:// or ldapi:// URI")
    out = {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_BIND_DN": env.str("AUTH_LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": env.str("AUTH_LDAP_BIND_PASSWORD", ""),
        "AUTH_LDAP_START_TLS": env.bool("AUTH_LDAP_START_TLS", False),
        "AUTH_LDAP_USER_ATTR_MAP": env.json("AUTH_LDAP_ATTR_MAP", _DEFAULT_ATTR_MAP, check=_attr_map_errors),
        "AUTH_LDAP_CONNECTION_OPTIONS": _connection_options(env, ldap),
        # The library's own mirror (every directory group by name, local groups dropped); the
        # group map below is the usual way.
        "AUTH_LDAP_MIRROR_GROUPS": env.bool("AUTH_LDAP_MIRROR_GROUPS", False) or None,
        "AUTH_LDAP_GROUP_MAP": env.json("AUTH_LDAP_GROUP_MAP", {}, check=_group_map_errors),
        "AUTH_LDAP_LOGIN_LABEL": env.str("AUTH_LDAP_LOGIN_LABEL", "Sign in with your campus account"),
    }
    template = env.str("AUTH_LDAP_USER_DN_TEMPLATE", "")
    if template:
        if "%(user)s" not in template:
            raise ImproperlyConfigured("AUTH_LDAP_USER_DN_TEMPLATE: must contain %(user)s")
        out["AUTH_LDAP_USER_DN_TEMPLATE"] = template
    else:
        base = env.str("AUTH_LDAP_USER_SEARCH_BASEDN", "")
        if not base:
            raise ImproperlyConfigured(
                "AUTH_LDAP_SERVER_URI is set: also set AUTH_LDAP_USER_DN_TEMPLATE (direct bind) "
                "or AUTH_LDAP_USER_SEARCH_BASEDN (search, then bind)"
            )
        search_filter = env.str("AUTH_LDAP_USER_SEARCH_FILTER", "(uid=%(user)s)")
        if "%(user)s" not in search_filter:
            raise ImproperlyConfigured("AUTH_LDAP_USER_SEARCH_FILTER: must contain %(user)s")
        out["AUTH_LDAP_USER_SEARCH"] = config.LDAPSearch(base, ldap.SCOPE_SUBTREE, search_filter)
    out.update(_group_settings(env, ldap, config, out))
    require = env.str("AUTH_LDAP_REQUIRE_GROUP_DN", "")
    if require:
        if "AUTH_LDAP_GROUP_SEARCH" not in out:
            raise ImproperlyConfigured("AUTH_LDAP_REQUIRE_GROUP_DN needs AUTH_LDAP_GROUP_SEARCH_BASEDN")
        out["AUTH_LDAP_REQUIRE_GROUP"] = require
    return out


def _connection_options(env, ldap):
    seconds = env.float("AUTH_LDAP_TIMEOUT", 5.0, minimum=0.1)
    # A directory that does not answer costs a sign-in this long, not the OS's TCP timeout.
    options = {ldap.OPT_REFERRALS: 0, ldap.OPT_NETWORK_TIMEOUT: seconds, ldap.OPT_TIMEOUT: seconds}
    ca_file = env.str("AUTH_LDAP_CA_FILE", "")
    if ca_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
    if env.bool("AUTH_LDAP_IGNORE_CERT_ERRORS", False):
        options[ldap.OPT_X_TLS_REQUIRE_CERT] = ldap.OPT_X_TLS_NEVER
    if len(options) > 3:
        # TLS options take effect only in a new TLS context, which must be asked for last.
        options[ldap.OPT_X_TLS_NEWCTX] = 0
    return options


def _group_settings(env, ldap, config, out):
    base = env.str("AUTH_LDAP_GROUP_SEARCH_BASEDN", "")
    if not base:
        if any(not isinstance(v, dict) for v in out["AUTH_LDAP_GROUP_MAP"].values()) or out["AUTH_LDAP_MIRROR_GROUPS"]:
            raise ImproperlyConfigured(
                "AUTH_LDAP_GROUP_MAP names group DNs (or AUTH_LDAP_MIRROR_GROUPS is on): "
                "set AUTH_LDAP_GROUP_SEARCH_BASEDN"
            )
        return {}
    wanted = env.str("AUTH_LDAP_GROUP_TYPE", "GroupOfNamesType").strip().lower()
    by_name = {name.lower(): name for name in _GROUP_TYPES} | {name[:-4].lower(): name for name in _GROUP_TYPES}
    if wanted not in by_name:
        raise ImproperlyConfigured(f"AUTH_LDAP_GROUP_TYPE: expected one of {', '.join(_GROUP_TYPES)}, got {wanted!r}")
    cls = getattr(config, by_name[wanted])
    name_attr = env.str("AUTH_LDAP_GROUP_NAME_ATTR", "cn")
    if cls.__name__.startswith(("MemberDN", "NestedMemberDN")):
        group_type = cls(env.str("AUTH_LDAP_GROUP_MEMBER_ATTR", "member"), name_attr=name_attr)
    else:
        group_type = cls(name_attr=name_attr)
    search_filter = env.str("AUTH_LDAP_GROUP_SEARCH_FILTER", "(objectClass=*)")
    return {
        "AUTH_LDAP_GROUP_SEARCH": config.LDAPSearch(base, ldap.SCOPE_SUBTREE, search_filter),
        "AUTH_LDAP_GROUP_TYPE": group_type,
    }


def _attr_map_errors(value):
    if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
        return 'expected a JSON object of user field → attribute name, e.g. {"email": "mail"}'
    unknown = set(value) - _USER_FIELDS
    if unknown:
        return f"unknown user fields {', '.join(sorted(unknown))} (use {', '.join(sorted(_USER_FIELDS))})"
    return None


def _group_map_errors(value):
    if not isinstance(value, dict):
        return "expected a JSON object: group DN → group name, or attribute → {value: group name}"
    import ldap.dn

    for key, target in value.items():
        if isinstance(target, dict):
            problem = value_map_errors(key, target)
            if problem:
                return problem
        elif not ldap.dn.is_dn(key) or "=" not in key:
            return f"{key!r} is not a group DN (or map an attribute's values with an object)"
        elif not names_ok(target):
            return f"{key!r} must map to a group name or a list of them"
    return None
