from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models import Q
        from django_q.signals import post_spawn

        from provisioning.vms import quotas, verify
        from reservations import services, tasks
        from reservations.models import Reservation
        from vclmgr import topics

        topics.register("reservation", services.may_see)
        quotas.register("reservation", services.holdings)
        verify.register_claim_holder(lambda: Q(reservations__status__in=Reservation.ACTIVE))
        post_spawn.connect(tasks.start_clock, dispatch_uid="reservations.clock")
