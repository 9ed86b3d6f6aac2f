"""The periodic facts refresh: a django-q2 Schedule (a starting worker re-times or re-creates it)."""

from django.conf import settings
from django.db import migrations

NAME = "vclmgr: facts refresh"
FUNC = "provisioning.tasks.refresh_all"


def create(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    minutes = settings.FACTS_REFRESH_MINUTES
    if minutes > 0 and not Schedule.objects.filter(name=NAME).exists():
        Schedule.objects.create(name=NAME, func=FUNC, schedule_type="I", minutes=minutes, repeats=-1)


def remove(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("vms", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create, remove)]
