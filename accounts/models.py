"""Accounts: API tokens, the roles' permissions and sign-on identities.

These models were the core app's (label ``vclmgr``) and moved without their data: each keeps its
table (``db_table``), and the migrations moved only Django's idea of them
(``accounts/migrations/0001_initial.py``, ``core/migrations/0005_accounts_models_moved.py``).
"""

from django.conf import settings
from django.db import models


def default_scopes():
    return ["read"]


class ApiToken(models.Model):
    """An API token for integrations. Only a SHA-256 digest is stored; the token is shown once.

    Tokens are 256-bit random strings, so a fast digest is as good as a slow password hash
    here and keeps authentication to one indexed lookup.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise a token.")
    digest = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(
        default=default_scopes,
        help_text="What the token may do: read, reserve, run, operate, admin (never more than its user's roles).",
    )
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "vclmgr_apitoken"
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="apitoken_unique_name_per_user")]
        ordering = ["-created"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class Access(models.Model):
    """No rows: it only holds the role permissions (``accounts.access`` owns the rules)."""

    class Meta:
        db_table = "vclmgr_access"
        managed = False
        default_permissions = ()
        permissions = [
            ("teach", "Instructor: block allocations for their groups"),
            ("maintain_images", "Image maintainer: capture, publish, retire their groups' images"),
            ("operate", "Operator: node states, evacuations, plans"),
            ("audit", "Auditor: read everything"),
            ("approve", "Approver: approve or deny requests that need approval"),
        ]

    def __str__(self):
        return "access"


class SignOnIdentity(models.Model):
    """Who a sign-on method vouched an account is: an issuer's subject, bound to one user.

    OpenID Connect finds a user by its ``(issuer, sub)`` only; LDAP and SAML record theirs so no
    other method takes the account over and the directory retires only the accounts it made
    (accounts/signon.py, accounts/oidc.py, accounts/saml.py)."""

    METHODS = [("ldap", "LDAP"), ("saml", "SAML"), ("oidc", "OpenID Connect")]

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="signon_identities")
    method = models.CharField(max_length=8, choices=METHODS)
    issuer = models.CharField(max_length=255, help_text="the OIDC issuer, the SAML IdP's entity ID, or 'ldap'")
    subject = models.CharField(max_length=255, help_text="OIDC sub, SAML username, or the directory's user name")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "vclmgr_signonidentity"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="signon_identity_unique")]

    def __str__(self):
        return f"{self.get_method_display()} {self.issuer} {self.subject} → {self.user_id}"


def _check_zone(name):
    from django.core.exceptions import ValidationError

    from core import localtime

    if name and not localtime.is_zone(name):
        raise ValidationError(f"{name!r} is not a time zone name such as Europe/Berlin or America/New_York")


class Preferences(models.Model):
    """A user's own settings, made on first need (``accounts.preferences``).

    The zone pages, forms and e-mails use is the one the user chose, else the one their browser
    last reported, else ``settings.TIME_ZONE``; the API always speaks UTC."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences")
    time_zone = models.CharField(
        max_length=64, blank=True, validators=[_check_zone], help_text="An IANA zone name; blank: not chosen."
    )
    browser_time_zone = models.CharField(
        max_length=64, blank=True, validators=[_check_zone], help_text="The zone the user's browser last reported."
    )

    class Meta:
        verbose_name_plural = "preferences"

    def __str__(self):
        return f"preferences of {self.user}"
