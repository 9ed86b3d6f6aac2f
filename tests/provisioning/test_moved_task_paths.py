"""Schedules naming the VM app's old module paths run their tasks where they are now, after `migrate`."""

from importlib import import_module

import pytest
from django.apps import apps
from django.utils.module_loading import import_string
from django_q.models import Schedule

from provisioning import tasks

MIGRATION = import_module("provisioning.migrations.0015_moved_task_paths")
FUNCS = (tasks.REFRESH_FUNC, tasks.END_FUNC, tasks.VERIFY_FUNC)


@pytest.mark.django_db
def test_the_old_paths_are_rewritten_and_import():
    for func in FUNCS:
        old = MIGRATION.OLD + func.removeprefix(MIGRATION.NEW)
        Schedule.objects.create(name=func, func=old, schedule_type=Schedule.MINUTES, minutes=5, repeats=-1)
    other = Schedule.objects.create(name="other", func="jobs.tasks.sweep", schedule_type=Schedule.MINUTES)

    MIGRATION.rewrite(apps, None)
    MIGRATION.rewrite(apps, None)  # a second run finds nothing to do

    rows = dict(Schedule.objects.filter(name__in=FUNCS).values_list("name", "func"))
    assert rows == {func: func for func in FUNCS}
    assert all(callable(import_string(func)) for func in FUNCS)
    other.refresh_from_db()
    assert other.func == "jobs.tasks.sweep"
