"""Schedules naming the job system's old module paths heal at `migrate`.

A django-q2 Schedule stores the dotted path of the function it runs (and of its hook). The job
system was the package ``provisioning.jobs`` before it became the top-level ``jobs``: a
Schedule still naming the old path would fail to import at every run until a worker started
and re-made its own (``tasks.ensure_schedule``), and one made by hand would never heal. Going
back leaves the rows as they are (the old code re-makes its own Schedules as well).
"""

from django.db import migrations

OLD, NEW = "provisioning.jobs.", "jobs."
FIELDS = ("func", "hook")


def rewrite(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    for field in FIELDS:
        for schedule in Schedule.objects.filter(**{f"{field}__startswith": OLD}):
            setattr(schedule, field, NEW + getattr(schedule, field)[len(OLD) :])
            schedule.save(update_fields=[field])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_gauge"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(rewrite, migrations.RunPython.noop, elidable=True)]
