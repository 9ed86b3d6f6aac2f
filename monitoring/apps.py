from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"

    def ready(self):
        from core import metrics
        from monitoring.collector import StateCollector

        metrics.register_collector(StateCollector())
