from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "provisioning.capacity"
    label = "capacity"
    verbose_name = "Capacity claims"

    def ready(self):
        from inventory import services as inventory

        inventory.IN_USE_CHECKERS.append(_live_allocations)


def _live_allocations(hypervisor):
    from django.db.models import Q
    from django.utils import timezone

    from provisioning.capacity.models import Allocation

    live = Allocation.objects.filter(host=hypervisor, released__isnull=True).filter(
        Q(end__isnull=True) | Q(end__gt=timezone.now())
    )
    count = live.count()
    return f"{count} live allocation{'s' if count != 1 else ''} (VMs or reservations)" if count else None
