"""What Ganeti's RAPI has that vclmgr had nowhere else: tags on the cluster itself, job filter rules."""

from django.db import models


class ClusterTag(models.Model):
    """A tag of the whole cluster (``/2/tags``; htools reads ``htools:…`` tags there)."""

    name = models.CharField(max_length=100, unique=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class FilterRule(models.Model):
    """A Ganeti job filter rule (``/2/filters``), applied to the jobs submitted through the RAPI
    (``job_filters`` says which actions and how)."""

    uuid = models.UUIDField(unique=True)
    priority = models.PositiveIntegerField(default=0)
    predicates = models.JSONField(default=list, blank=True)
    action = models.JSONField(help_text='ACCEPT, CONTINUE, PAUSE, REJECT or ["RATE_LIMIT", n]')
    reason_trail = models.JSONField(default=list, blank=True)
    watermark = models.BigIntegerField(default=0, help_text="The highest job id when the rule was stored.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["priority", "watermark", "uuid"]

    def __str__(self):
        return f"filter {self.uuid}"
