"""The one thing Ganeti's RAPI has that vclmgr had nowhere else: tags on the cluster itself."""

from django.db import models


class ClusterTag(models.Model):
    """A tag of the whole cluster (``/2/tags``; htools reads ``htools:…`` tags there)."""

    name = models.CharField(max_length=100, unique=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
