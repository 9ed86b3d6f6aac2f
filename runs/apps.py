from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from capacity import preemption
        from core import events, topics
        from provisioning import quotas, usage
        from runs import services, tasks

        topics.AUTHORISERS.register("run", services.may_see)
        quotas.HOLDERS.register("run", services.holdings)
        usage.SOURCES.register(services.uses)
        events.LISTENERS.register("job.status", events.Listener(services.job_ended))
        events.LISTENERS.register("allocation.released", events.Listener(services.room_returned))
        preemption.HOLDERS.register(preemption.Holder(services.preemptible, services.suspend_for, noun="run"))
        post_spawn.connect(tasks.on_worker_start, dispatch_uid="runs.housekeeping")
