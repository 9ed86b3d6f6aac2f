from django.apps import AppConfig
from django.db.backends.signals import connection_created

from vclmgr.private_files import tighten_sqlite


class VclmgrConfig(AppConfig):
    name = "vclmgr"
    verbose_name = "vclmgr core"

    def ready(self):
        from vclmgr import topics

        topics.register_builtin_topics()
        connection_created.connect(_private_sqlite_file)


def _private_sqlite_file(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        tighten_sqlite(connection.settings_dict["NAME"])
