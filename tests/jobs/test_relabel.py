"""``relabel_jobs``: a database made when the Job models were app ``provisioning`` is carried over."""

from io import StringIO

import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from jobs.management.commands.relabel_jobs import MIGRATIONS, relabel
from jobs.models import Job, JobLog
from tests.jobs.helpers import submit


def _old_layout():
    """Put the test database back in the old layout (the same function, run backwards)."""
    assert relabel(old="jobs", new="provisioning", migrations={v: k for k, v in MIGRATIONS.items()})
    MigrationRecorder.Migration.objects.filter(app="jobs").delete()  # later ones: migrate applies them
    ContentType.objects.clear_cache()


def _applied(app):
    return set(MigrationRecorder.Migration.objects.filter(app=app).values_list("name", flat=True))


@pytest.mark.django_db
def test_it_renames_tables_migrations_and_content_types_of_an_old_database():
    job = submit()
    ct = ContentType.objects.get_for_model(Job).pk
    _old_layout()
    tables = set(connection.introspection.table_names())
    assert "provisioning_job" in tables and "jobs_job" not in tables
    assert _applied("provisioning") == set(MIGRATIONS) and not _applied("jobs")

    out = StringIO()
    call_command("relabel_jobs", stdout=out)

    ContentType.objects.clear_cache()
    tables = set(connection.introspection.table_names())
    assert {"jobs_job", "jobs_jobdependency", "jobs_joblog", "jobs_queuesettings"} <= tables
    assert not {t for t in tables if t.startswith("provisioning_")}
    assert _applied("jobs") == set(MIGRATIONS.values()) and not _applied("provisioning")
    assert ContentType.objects.get_for_model(Job).pk == ct and not ContentType.objects.filter(app_label="provisioning")
    assert "renamed" in out.getvalue()
    # The rows, their foreign keys and the id sequence survive.
    assert Job.objects.get(pk=job.pk).opcode == "noop" and JobLog.objects.filter(job_id=job.pk).exists()
    assert submit().pk > job.pk


@pytest.mark.django_db
def test_it_does_nothing_on_a_current_database():
    before = _applied("jobs")
    assert relabel() is False
    call_command("relabel_jobs", stdout=StringIO())
    assert _applied("jobs") == before and "jobs_job" in connection.introspection.table_names()
