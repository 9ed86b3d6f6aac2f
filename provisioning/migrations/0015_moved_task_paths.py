"""Schedules naming the VM app's old module paths heal at `migrate`.

A django-q2 Schedule stores the dotted path of the function it runs (and of its hook). This app
was the package ``provisioning.vms`` before it became ``provisioning`` itself (its label,
``vms``, stays): the facts refresh, the VM clock and the periodic verify would fail to import
at every run until a worker started and re-made them (``tasks.on_worker_start``), and a
Schedule made by hand would never heal. Going back leaves the rows as they are (the old code
re-makes its own Schedules as well).
"""

from django.db import migrations

OLD, NEW = "provisioning.vms.", "provisioning."
FIELDS = ("func", "hook")


def rewrite(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    for field in FIELDS:
        for schedule in Schedule.objects.filter(**{f"{field}__startswith": OLD}):
            setattr(schedule, field, NEW + getattr(schedule, field)[len(OLD) :])
            schedule.save(update_fields=[field])


class Migration(migrations.Migration):
    dependencies = [
        ("vms", "0014_imagevariant_guest_login"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(rewrite, migrations.RunPython.noop, elidable=True)]
