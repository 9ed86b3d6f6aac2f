from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from capacity import services as capacity
        from core import topics
        from inventory import services as inventory
        from jobs import transitions
        from provisioning import quotas, repair, verify
        from provisioning.opcodes import lifecycle
        from reservations import services, tasks

        topics.AUTHORISERS.register("reservation", services.may_see)
        quotas.register("reservation", services.holdings)
        verify.register_claim_holder(services.held_claims)
        if services.follow_claim not in capacity.ON_MOVED:
            capacity.ON_MOVED.append(services.follow_claim)
        if services.host_left_service not in inventory.ON_STATE_CHANGE:
            inventory.ON_STATE_CHANGE.append(services.host_left_service)
        if services.vm_gone not in repair.ON_GONE:
            repair.ON_GONE.append(services.vm_gone)
        if services.settle_built not in lifecycle.ON_BUILT:
            lifecycle.ON_BUILT.append(services.settle_built)
        transitions.on_end("vm.create", services.settle_unbuilt)
        post_spawn.connect(tasks.start_clock, dispatch_uid="reservations.clock")
