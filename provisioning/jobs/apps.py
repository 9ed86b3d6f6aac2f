from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "provisioning.jobs"
    label = "jobs"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules
        from django_q.signals import post_spawn

        from provisioning.jobs import opcodes, tasks  # noqa: F401 (registers the built-in opcodes)
        from vclmgr import topics

        topics.register("job", _may_watch_job)
        # Other apps register their opcodes in <app>/opcodes.py.
        autodiscover_modules("opcodes")
        post_spawn.connect(tasks.start_janitor, dispatch_uid="provisioning.jobs.janitor")


def _may_watch_job(user, rest):
    """``job.<id>``: the job's submitter, or staff."""
    if user.is_staff:
        return rest.isdigit()
    from provisioning.jobs.models import Job

    return rest.isdigit() and len(rest) < 19 and Job.objects.filter(pk=int(rest), submitter=user).exists()
