from django.conf import settings
from django.db import models


class Allocation(models.Model):
    """A claim on a host's resources over ``[start, end)`` (``end`` null = open-ended).

    Written by ``capacity.services.claim`` only, in the transaction that re-checked the
    host's capacity under its row lock (``hold`` aside: it records a VM that could not be
    removed, without a check). A released claim keeps its row for history.
    """

    # Live claims keep their host from being deleted (an in-use check in inventory);
    # released ones are history that goes with it.
    host = models.ForeignKey("inventory.Hypervisor", on_delete=models.CASCADE, related_name="allocations")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    purpose = models.CharField(max_length=200, help_text="What holds it: 'reservation 12', 'vm 7'.")
    vcpus = models.FloatField()
    memory_mib = models.FloatField()
    disk_gib = models.FloatField()
    extras = models.JSONField(default=dict, blank=True)
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)
    anti_affinity = models.CharField(max_length=100, blank=True)
    yields = models.BooleanField(
        default=False, help_text="A warm VM's: a claim that needs its room takes it (the VM is destroyed)."
    )
    created = models.DateTimeField(auto_now_add=True)
    released = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["host", "released", "end"], name="allocation_host_live"),
            models.Index(fields=["released", "end"], name="allocation_live"),
        ]
        ordering = ["start", "id"]

    def __str__(self):
        return f"{self.purpose} on {self.host_id} {self.start:%Y-%m-%d %H:%M}"

    @property
    def active(self):
        return self.released is None

    def resources_dict(self):
        return {"vcpus": self.vcpus, "memory_mib": self.memory_mib, "disk_gib": self.disk_gib, **self.extras}
