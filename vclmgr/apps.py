from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate

from vclmgr.private_files import tighten_sqlite


class VclmgrConfig(AppConfig):
    name = "vclmgr"
    verbose_name = "vclmgr core"

    def ready(self):
        from axes.signals import user_locked_out
        from django_q.signals import post_spawn

        from vclmgr import access, events, lifeline, lockout, metrics, reconnect, topics, worker_health

        post_migrate.connect(access.ensure_roles, sender=self, dispatch_uid="vclmgr.access.roles")

        topics.register_builtin_topics()
        events.listen("job.status", metrics.on_job_status)
        lifeline.watch()  # a process of `serve`'s tree ends when the supervisor does
        connection_created.connect(_private_sqlite_file)
        connection_created.connect(reconnect.install, dispatch_uid="vclmgr.reconnect")
        post_spawn.connect(worker_health.start, dispatch_uid="vclmgr.worker_health")
        user_locked_out.connect(lockout.log_lockout, dispatch_uid="vclmgr.lockout.log")


def _private_sqlite_file(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        tighten_sqlite(connection.settings_dict["NAME"])
