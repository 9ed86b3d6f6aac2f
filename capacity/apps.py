from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "capacity"
    label = "capacity"
    verbose_name = "Capacity claims"

    def ready(self):
        from capacity import services
        from inventory import services as inventory

        inventory.IN_USE_CHECKERS.register(_live_allocations)
        inventory.CLAIMS_END.register(services.claims_end)


def _live_allocations(hypervisor):
    from capacity.models import Allocation

    # Over its end or not: a claim is held until released, when its VM is known to be gone.
    count = Allocation.objects.filter(host=hypervisor, released__isnull=True).count()
    return f"{count} live allocation{'s' if count != 1 else ''} (VMs or reservations)" if count else None
