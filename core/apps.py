from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate

from core.private_files import tighten_sqlite


class VclmgrConfig(AppConfig):
    name = "vclmgr"
    verbose_name = "vclmgr core"

    def ready(self):
        from axes.signals import user_locked_out
        from django_q.signals import post_spawn

        from accounts import access, lockout
        from core import events, lifeline, metrics, reconnect, topics
        from monitoring import worker_health

        post_migrate.connect(access.ensure_roles, sender=self, dispatch_uid="accounts.access.roles")

        topics.register_builtin_topics()
        events.listen("job.status", metrics.on_job_status)
        lifeline.watch()  # a process of `serve`'s tree ends when the supervisor does
        connection_created.connect(_private_sqlite_file)
        connection_created.connect(reconnect.install, dispatch_uid="core.reconnect")
        post_spawn.connect(worker_health.start, dispatch_uid="monitoring.worker_health")
        user_locked_out.connect(lockout.log_lockout, dispatch_uid="accounts.lockout.log")


def _private_sqlite_file(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        tighten_sqlite(connection.settings_dict["NAME"])
