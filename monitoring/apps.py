from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"

    def ready(self):
        from monitoring.collector import StateCollector
        from vclmgr import metrics

        metrics.register_collector(StateCollector())
