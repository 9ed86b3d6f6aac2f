from django.apps import AppConfig
from django.db.models.signals import post_save


class CapacityConfig(AppConfig):
    name = "capacity"
    label = "capacity"
    verbose_name = "Capacity claims"

    def ready(self):
        from capacity import services
        from inventory import services as inventory

        inventory.IN_USE_CHECKERS.register(_live_allocations)
        inventory.CLAIMS_END.register(services.claims_end)
        post_save.connect(_created_in_transaction, sender="capacity.Allocation", dispatch_uid="snapshot-tentative")


def _created_in_transaction(sender, instance, created, **kwargs):
    """Every writer of claims at once (claim, extend, hold, resize, move): the process's snapshot
    learns the claims of a transaction that may still roll back."""
    from django.db import connection

    from capacity.snapshot import snapshot

    if created and connection.in_atomic_block:
        snapshot.note_created(instance.pk)


def _live_allocations(hypervisor):
    from capacity.models import Allocation

    # Over its end or not: a claim is held until released, when its VM is known to be gone.
    count = Allocation.objects.filter(host=hypervisor, released__isnull=True).count()
    return f"{count} live allocation{'s' if count != 1 else ''} (VMs or reservations)" if count else None
