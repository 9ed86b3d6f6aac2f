from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "provisioning.capacity"
    label = "capacity"
    verbose_name = "Capacity claims"

    def ready(self):
        from inventory import services as inventory

        inventory.IN_USE_CHECKERS.append(_live_allocations)


def _live_allocations(hypervisor):
    from provisioning.capacity.models import Allocation

    # Over its end or not: a claim is held until released, when its VM is known to be gone.
    count = Allocation.objects.filter(host=hypervisor, released__isnull=True).count()
    return f"{count} live allocation{'s' if count != 1 else ''} (VMs or reservations)" if count else None
