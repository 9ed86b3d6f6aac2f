from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from reservations import services, tasks
        from vclmgr import topics

        topics.register("reservation", services.may_see)
        post_spawn.connect(tasks.start_clock, dispatch_uid="reservations.clock")
