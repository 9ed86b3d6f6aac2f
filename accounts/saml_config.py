"""SAML 2.0 / Shibboleth sign-on settings, read from the environment (docs/admin/sign-on.md, "SAML / Shibboleth").

``saml_settings(env, debug=...)`` returns djangosaml2's Django settings (``SAML_CONFIG`` — the
pysaml2 configuration —, ``SAML_ATTRIBUTE_MAPPING``, …), or ``{}`` when neither
``SAML_METADATA_LOCAL`` nor ``SAML_METADATA_REMOTE`` names the IdP's metadata (SAML off).
Variables are named after pysaml2's configuration keys (``entityid`` → ``SAML_ENTITYID``,
``key_file`` → ``SAML_KEY_FILE``, ``metadata.local``/``remote`` → ``SAML_METADATA_*``,
``want_assertions_signed`` → ``SAML_WANT_ASSERTIONS_SIGNED``, …) and djangosaml2's settings
(``SAML_ATTRIBUTE_MAPPING``, ``SAML_CREATE_UNKNOWN_USER``, ``SAML_DEFAULT_BINDING``), so their
documentation applies. ``SAML_GROUP_MAP`` is vclmgr's own (accounts/group_map.py).

Everything that can be checked without the IdP is checked here, so a bad value stops the start
naming the variable: the key pair (readable, PEM, the key matches the certificate), xmlsec1,
local metadata (parsed by pysaml2; it must describe an IdP), the URLs and the maps. Remote
metadata is fetched on first use (accounts/saml.py), so vclmgr starts while the IdP is down.
"""

import shutil
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from accounts.group_map import attribute_map_errors

_USER_FIELDS = {"username", "email", "first_name", "last_name"}
# eduPerson / inetOrgPerson friendly names; pysaml2 translates Shibboleth's urn:oid names to them.
_DEFAULT_ATTRIBUTE_MAPPING = {
    "eduPersonPrincipalName": ["username"],
    "mail": ["email"],
    "givenName": ["first_name"],
    "sn": ["last_name"],
}


def saml_settings(env, *, debug):
    local = env.list("SAML_METADATA_LOCAL", [])
    remote = env.str("SAML_METADATA_REMOTE", "").strip()
    if not local and not remote:
        return {}
    from saml2 import BINDING_HTTP_POST, BINDING_HTTP_REDIRECT, BINDING_SOAP, xmldsig
    from saml2.config import PREFERRED_BINDING

    base = _base_url(env, debug)
    entityid = env.str("SAML_ENTITYID", f"{base}/saml2/metadata/")
    key_file, cert_file = _key_pair(env)
    metadata = {}
    if local:
        for path in local:
            if not Path(path).is_file():
                raise ImproperlyConfigured(f"SAML_METADATA_LOCAL: {path} is not a readable file")
        metadata["local"] = local
    if remote:
        metadata["remote"] = [_remote(env, remote, debug)]
    config = {
        "entityid": entityid,
        "xmlsec_binary": _xmlsec(env),
        "allow_unknown_attributes": True,
        "key_file": key_file,
        "cert_file": cert_file,
        # Shibboleth encrypts assertions to an SP whose metadata offers a key: this pair.
        "encryption_keypairs": [{"key_file": key_file, "cert_file": cert_file}],
        "metadata": metadata,
        # pysaml2 fetches remote metadata with no timeout unless given one: a silent IdP would
        # hold every sign-in (accounts/saml.py loads it under a lock) for ever.
        "http_client_timeout": env.float("SAML_HTTP_CLIENT_TIMEOUT", 10.0, minimum=0.1, maximum=600),
        # Single logout through the browser (a redirect) first, where the IdP offers it.
        "preferred_binding": {
            **PREFERRED_BINDING,
            "single_logout_service": [BINDING_HTTP_REDIRECT, BINDING_HTTP_POST, BINDING_SOAP],
        },
        "accepted_time_diff": env.int("SAML_ACCEPTED_TIME_DIFF", 60, minimum=0, maximum=600),
        "service": {
            "sp": {
                "name": env.str("SAML_PROVIDER_NAME", "SAML"),
                "endpoints": {
                    "assertion_consumer_service": [(f"{base}/saml2/acs/", BINDING_HTTP_POST)],
                    "single_logout_service": [
                        (f"{base}/saml2/ls/", BINDING_HTTP_REDIRECT),
                        (f"{base}/saml2/ls/post/", BINDING_HTTP_POST),
                    ],
                },
                # Only answers to our own requests: an unsolicited or replayed response is refused.
                "allow_unsolicited": False,
                "authn_requests_signed": env.bool("SAML_AUTHN_REQUESTS_SIGNED", False),
                "logout_requests_signed": env.bool("SAML_LOGOUT_REQUESTS_SIGNED", True),
                "want_assertions_signed": env.bool("SAML_WANT_ASSERTIONS_SIGNED", True),
                "want_response_signed": env.bool("SAML_WANT_RESPONSE_SIGNED", False),
                "signing_algorithm": xmldsig.SIG_RSA_SHA256,
                "digest_algorithm": xmldsig.DIGEST_SHA256,
            }
        },
    }
    sp = config["service"]["sp"]
    if not (sp["want_assertions_signed"] or sp["want_response_signed"]):
        raise ImproperlyConfigured(
            "SAML_WANT_ASSERTIONS_SIGNED and SAML_WANT_RESPONSE_SIGNED are both off: anyone could forge a sign-in"
        )
    if local:
        _check_local_metadata(config)
    use_name_id = env.bool("SAML_USE_NAME_ID_AS_USERNAME", False)
    mapping = env.json("SAML_ATTRIBUTE_MAPPING", _DEFAULT_ATTRIBUTE_MAPPING, check=_mapping_errors(use_name_id))
    binding = env.choice("SAML_DEFAULT_BINDING", ["redirect", "post"], "redirect")
    return {
        "SAML_CONFIG": config,
        "SAML_CONFIG_LOADER": "accounts.saml.sp_config",
        "SAML_METADATA_REFRESH": env.int("SAML_METADATA_REFRESH", 3600, minimum=60),
        "SAML_ATTRIBUTE_MAPPING": {name: tuple(fields) for name, fields in mapping.items()},
        "SAML_DJANGO_USER_MAIN_ATTRIBUTE": "username",
        "SAML_USE_NAME_ID_AS_USERNAME": use_name_id,
        "SAML_CREATE_UNKNOWN_USER": env.bool("SAML_CREATE_UNKNOWN_USER", True),
        "SAML_DEFAULT_BINDING": {"redirect": BINDING_HTTP_REDIRECT, "post": BINDING_HTTP_POST}[binding],
        "SAML_GROUP_MAP": env.json("SAML_GROUP_MAP", {}, check=attribute_map_errors),
        "SAML_PROVIDER_NAME": sp["name"],
    }


def _base_url(env, debug):
    base = env.url("SAML_BASE_URL", {"https", "http"})
    if not base:
        raise ImproperlyConfigured(
            "SAML is on (SAML_METADATA_LOCAL/REMOTE): set SAML_BASE_URL, vclmgr's public URL (https://vcl.example.edu)"
        )
    if base.startswith("http:") and not debug:
        raise ImproperlyConfigured("SAML_BASE_URL: use https:// (the IdP posts signed assertions there)")
    return base.rstrip("/")


def _key_pair(env):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    paths = {}
    for name in ("SAML_KEY_FILE", "SAML_CERT_FILE"):
        path = env.str(name, "")
        if not path:
            raise ImproperlyConfigured(f"SAML is on: set {name} (the SP's PEM {name.split('_')[1].lower()})")
        try:
            paths[name] = (path, Path(path).read_bytes())
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}: cannot read {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_pem_private_key(paths["SAML_KEY_FILE"][1], password=None)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"SAML_KEY_FILE: not an unencrypted PEM private key ({exc})") from None
    try:
        cert = x509.load_pem_x509_certificate(paths["SAML_CERT_FILE"][1])
    except ValueError as exc:
        raise ImproperlyConfigured(f"SAML_CERT_FILE: not a PEM certificate ({exc})") from None
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        raise ImproperlyConfigured(
            "SAML_KEY_FILE and SAML_CERT_FILE do not belong together (another key's certificate)"
        )
    return paths["SAML_KEY_FILE"][0], paths["SAML_CERT_FILE"][0]


def _remote(env, url, debug):
    if not url.startswith(("https://", "http://")):
        raise ImproperlyConfigured(f"SAML_METADATA_REMOTE: {url!r} is not an https:// URL")
    cert = env.str("SAML_METADATA_REMOTE_CERT", "") or None
    if cert is not None and not Path(cert).is_file():
        raise ImproperlyConfigured(f"SAML_METADATA_REMOTE_CERT: {cert} is not a readable file")
    if url.startswith("http:") and cert is None and not debug:
        # Unsigned metadata over plain HTTP: whoever is on the path picks the IdP's key.
        raise ImproperlyConfigured(
            "SAML_METADATA_REMOTE: use https://, or set SAML_METADATA_REMOTE_CERT to verify the metadata's signature"
        )
    return {"url": url, "cert": cert}


def _xmlsec(env):
    binary = env.str("SAML_XMLSEC_BINARY", "") or shutil.which("xmlsec1") or ""
    if not binary or not Path(binary).is_file():
        raise ImproperlyConfigured(
            "SAML needs xmlsec1 to check signatures: install Debian's xmlsec1 (make install), "
            "or set SAML_XMLSEC_BINARY to its path"
        )
    return binary


def _check_local_metadata(config):
    import copy

    from saml2.config import SPConfig

    local_only = {**copy.deepcopy(config), "metadata": {"local": config["metadata"]["local"]}}
    try:
        conf = SPConfig().load(local_only)
    except Exception as exc:  # pysaml2 raises many kinds for a bad file
        raise ImproperlyConfigured(f"SAML_METADATA_LOCAL: cannot load the IdP metadata: {exc}") from None
    if not conf.metadata.identity_providers():
        raise ImproperlyConfigured("SAML_METADATA_LOCAL: the metadata describes no IdP (no IDPSSODescriptor)")


def _mapping_errors(use_name_id):
    def check(value):
        if not isinstance(value, dict) or not all(
            isinstance(v, list) and v and all(isinstance(f, str) for f in v) for v in value.values()
        ):
            return 'expected a JSON object of SAML attribute → list of user fields, e.g. {"mail": ["email"]}'
        fields = {f for v in value.values() for f in v}
        unknown = fields - _USER_FIELDS
        if unknown:
            return f"unknown user fields {', '.join(sorted(unknown))} (use {', '.join(sorted(_USER_FIELDS))})"
        if "username" not in fields and not use_name_id:
            return (
                "no attribute gives the username (map eduPersonPrincipalName to it or set SAML_USE_NAME_ID_AS_USERNAME)"
            )
        return None

    return check
