from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from capacity import services as capacity
        from core import events, topics
        from inventory import services as inventory
        from jobs import transitions
        from provisioning import quotas, repair, resizing, verify, warm
        from provisioning import views as vm_pages
        from provisioning.management.commands import revision
        from provisioning.opcodes import lifecycle
        from reservations import approvals, environments, prestage, revision_cli, services, tasks, template_views, usage

        topics.AUTHORISERS.register("reservation", services.may_see)
        approvals.PROCEED.register(approvals.ApprovalRequest.Kind.RESERVATION, approvals.proceed_reservation)
        approvals.PROCEED.register(approvals.ApprovalRequest.Kind.ENVIRONMENT, environments.proceed)
        quotas.HOLDERS.register("reservation", services.holdings)
        verify.CLAIM_HOLDERS.register(services.held_claims)
        capacity.ON_MOVED.register(services.follow_claim)
        resizing.ON_RESIZED.register(services.follow_size)
        inventory.ON_STATE_CHANGE.register(services.host_left_service)
        repair.ON_GONE.register(services.vm_gone)
        lifecycle.ON_BUILT.register(services.settle_built)
        warm.STARTS.register(usage.starts_in)  # the usage history a warm pool is sized from
        transitions.ON_END.register("vm.create", services.settle_unbuilt)
        vm_pages.IMAGE_CARDS.register(template_views.template_card)
        for verb, spec in revision_cli.VERBS.items():
            revision.VERBS.register(verb, spec)
        events.LISTENERS.register("image.updated", events.Listener(prestage.on_image_updated))
        post_spawn.connect(tasks.start_clock, dispatch_uid="reservations.clock")
