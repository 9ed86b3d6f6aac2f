"""A Schedule naming the job system's old module path runs its task where it is now, after `migrate`."""

from importlib import import_module

import pytest
from django.apps import apps
from django.utils.module_loading import import_string
from django_q.models import Schedule

from jobs import tasks

MIGRATION = import_module("jobs.migrations.0004_moved_task_paths")


def old_path(path):
    return MIGRATION.OLD + path.removeprefix(MIGRATION.NEW)


@pytest.mark.django_db
def test_the_old_paths_are_rewritten_and_import():
    moved = Schedule.objects.create(
        name="sweep",
        func=old_path(tasks.SWEEP_FUNC),
        hook=old_path("jobs.tasks.run_next"),
        schedule_type=Schedule.MINUTES,
        minutes=1,
        repeats=-1,
    )
    other = Schedule.objects.create(name="other", func="reservations.tasks.tick", schedule_type=Schedule.MINUTES)

    MIGRATION.rewrite(apps, None)
    MIGRATION.rewrite(apps, None)  # a second run finds nothing to do

    moved.refresh_from_db()
    assert (moved.func, moved.hook) == (tasks.SWEEP_FUNC, "jobs.tasks.run_next")
    assert import_string(moved.func) is tasks.sweep and import_string(moved.hook) is tasks.run_next
    other.refresh_from_db()
    assert (other.func, other.hook) == ("reservations.tasks.tick", None)
