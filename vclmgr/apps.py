from django.apps import AppConfig


class VclmgrConfig(AppConfig):
    name = "vclmgr"
    verbose_name = "vclmgr core"

    def ready(self):
        from vclmgr import topics

        topics.register_builtin_topics()
