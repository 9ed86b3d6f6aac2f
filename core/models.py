"""Core models: the event outbox and API tokens."""

from django.conf import settings
from django.db import models


class Event(models.Model):
    """One state change, written in the same transaction as the change itself (outbox).

    A relay in each ASGI process reads new rows and forwards them to the websockets
    subscribed to ``topic``; a reconnecting client asks for rows after its last ``id``.
    """

    created = models.DateTimeField(auto_now_add=True, db_index=True)
    topic = models.CharField(max_length=100)
    kind = models.CharField(max_length=100)
    data = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["topic", "id"], name="event_topic_id")]

    def __str__(self):
        return f"#{self.id} {self.topic} {self.kind}"

    def as_message(self):
        return {
            "id": self.id,
            "topic": self.topic,
            "kind": self.kind,
            "time": self.created.isoformat(),
            "data": self.data,
        }


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
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="apitoken_unique_name_per_user")]
        ordering = ["-created"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class Access(models.Model):
    """No rows: it only holds the role permissions (``accounts.access`` owns the rules)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("teach", "Instructor: block allocations for their groups"),
            ("maintain_images", "Image maintainer: capture, publish, retire their groups' images"),
            ("operate", "Operator: node states, evacuations, plans"),
            ("audit", "Auditor: read everything"),
        ]

    def __str__(self):
        return "access"


class ObjectChange(models.Model):
    """Who changed what, when and why: written by services (web, API, CLI and jobs alike)."""

    ACTIONS = [("create", "create"), ("update", "update"), ("delete", "delete"), ("state", "state change")]

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor = models.CharField(max_length=150, help_text="user name, or 'cli', 'job 12', 'system'")
    action = models.CharField(max_length=10, choices=ACTIONS)
    content_type = models.ForeignKey("contenttypes.ContentType", on_delete=models.CASCADE)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    changes = models.JSONField(default=dict, blank=True, help_text="field: [old, new]")
    reason = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["content_type", "object_id", "-time"], name="objectchange_object")]
        ordering = ["-time", "-id"]

    def __str__(self):
        return f"{self.time:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.object_repr}"


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
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="signon_identity_unique")]

    def __str__(self):
        return f"{self.get_method_display()} {self.issuer} {self.subject} → {self.user_id}"
