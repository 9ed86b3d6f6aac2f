from django.apps import AppConfig
from django.db.backends.signals import connection_created

from core.private_files import tighten_sqlite


class CoreConfig(AppConfig):
    """The shared machinery. Its label is the project's old one, ``vclmgr``: the event outbox's and
    change log's tables, content types and migration history keep their names."""

    name = "core"
    label = "vclmgr"
    verbose_name = "vclmgr core"

    def ready(self):
        from core import lifeline, reconnect

        lifeline.watch()  # a process of `serve`'s tree ends when the supervisor does
        connection_created.connect(_private_sqlite_file)
        connection_created.connect(reconnect.install, dispatch_uid="core.reconnect")


def _private_sqlite_file(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        tighten_sqlite(connection.settings_dict["NAME"])
