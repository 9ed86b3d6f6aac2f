from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    label = "jobs"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules
        from django_q.signals import post_spawn

        from core import topics
        from jobs import opcodes, tasks  # noqa: F401 (registers the built-in opcodes)

        topics.AUTHORISERS.register("job", _may_watch_job)
        # Other apps register their opcodes in <app>/opcodes.py (``@opcode`` fills registry.OPCODES).
        autodiscover_modules("opcodes")
        post_spawn.connect(tasks.start_janitor, dispatch_uid="jobs.janitor")


def _may_watch_job(user, rest):
    """``job.<id>``: whoever may see the job (``services.visible_to``)."""
    from jobs import services

    return rest.isdigit() and len(rest) < 19 and services.visible_to(user).filter(pk=int(rest)).exists()
