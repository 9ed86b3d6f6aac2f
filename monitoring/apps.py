from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"

    def ready(self):
        from django_q.signals import post_spawn

        from core import events
        from monitoring import metrics, worker_health
        from monitoring.collector import StateCollector

        metrics.COLLECTORS.register(StateCollector)
        events.LISTENERS.register("job.status", events.Listener(metrics.on_job_status))
        post_spawn.connect(worker_health.start, dispatch_uid="monitoring.worker_health")
