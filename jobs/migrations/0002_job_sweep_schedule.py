"""The once-a-minute job sweep: a django-q2 Schedule (a worker re-creates it if missing)."""

from django.db import migrations

NAME = "vclmgr: job sweep"
FUNC = "jobs.tasks.sweep"


def create(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    if not Schedule.objects.filter(name=NAME).exists():
        Schedule.objects.create(name=NAME, func=FUNC, schedule_type="I", minutes=1, repeats=-1)


def remove(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create, remove)]
