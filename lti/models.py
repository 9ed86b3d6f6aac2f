"""An LMS course (an LTI context of one registered platform) and the group that is its course.

The platforms, their deployments, the tool's keys and what launches said (users, contexts,
memberships) are django-lti's models (app ``lti_tool``); this app adds the one link vclmgr needs:
which Django group is a platform's context. A context gets its own new group at its first
launch, never one found by name, so an LMS course titled like a local group or a role group
("operator") gives nobody that group.
"""

from django.contrib.auth.models import Group
from django.db import models
from lti_tool.models import LtiRegistration


class LtiCourse(models.Model):
    registration = models.ForeignKey(LtiRegistration, on_delete=models.CASCADE, related_name="courses")
    context_id = models.CharField(max_length=255, help_text="the context claim's id on the platform")
    title = models.CharField(max_length=500, blank=True, help_text="the context's title at its last launch")
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="lti_course")
    memberships_url = models.URLField(
        max_length=1000, blank=True, help_text="the roster (NRPS) URL the last launch offered; empty: none"
    )
    created = models.DateTimeField(auto_now_add=True)
    roster_synced = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "LTI course"
        constraints = [
            models.UniqueConstraint(fields=["registration", "context_id"], name="lticourse_unique_context"),
        ]

    def __str__(self):
        return f"{self.registration} {self.context_id} → {self.group}"


class SpentToken(models.Model):
    """An ID token a launch used: the SHA-256 of its issuer and nonce, kept while the nonce
    could still be accepted (PyLTI1p3 keeps a nonce a day) and the token has not expired.

    In the database, not the cache: the unique constraint makes "mark it used" atomic between
    web processes, which a file-based cache's ``add`` is not (check, then write)."""

    digest = models.CharField(max_length=64, unique=True)
    expires = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "spent LTI ID token"

    def __str__(self):
        return self.digest
