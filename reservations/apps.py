from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from provisioning.vms import quotas
        from reservations import services, tasks
        from vclmgr import topics

        topics.register("reservation", services.may_see)
        quotas.register("reservation", services.holdings)
        post_spawn.connect(tasks.start_clock, dispatch_uid="reservations.clock")
