"""``manage.py relabel_jobs``: carry a database made while the Job models were app ``provisioning``.

The Job models once belonged to app ``provisioning`` (tables ``provisioning_job`` …); they are
app ``jobs`` now. If table ``provisioning_job`` exists and ``jobs_job`` does not, this renames
the tables, the ``django_migrations`` rows and the content types to ``jobs``, all in one
transaction; otherwise it does nothing. ``make run`` calls it before ``migrate``.
"""

from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections, transaction

MODELS = ("job", "jobdependency", "joblog", "queuesettings")
MIGRATIONS = {"0001_jobs": "0001_initial", "0002_job_sweep_schedule": "0002_job_sweep_schedule"}


def relabel(using=DEFAULT_DB_ALIAS, old="provisioning", new="jobs", migrations=None):
    """Move the job tables from app ``old`` to app ``new``; True if it did, False if nothing to do."""
    connection = connections[using]
    tables = set(connection.introspection.table_names())
    if f"{old}_job" not in tables or f"{new}_job" in tables:
        return False
    quote = connection.ops.quote_name
    with transaction.atomic(using=using), connection.cursor() as cursor:
        for model in MODELS:
            if f"{old}_{model}" in tables:
                cursor.execute(f"ALTER TABLE {quote(f'{old}_{model}')} RENAME TO {quote(f'{new}_{model}')}")
        for before, after in (MIGRATIONS if migrations is None else migrations).items():
            cursor.execute(
                "UPDATE django_migrations SET app = %s, name = %s WHERE app = %s AND name = %s",
                [new, after, old, before],
            )
        cursor.execute("UPDATE django_content_type SET app_label = %s WHERE app_label = %s", [new, old])
    return True


class Command(BaseCommand):
    help = "Rename the job tables of a database made when they were app 'provisioning' (no-op otherwise)."

    def add_arguments(self, parser):
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args, **options):
        if relabel(options["database"]):
            self.stdout.write("job tables renamed: provisioning_* -> jobs_*")
        elif options["verbosity"] > 1:
            self.stdout.write("nothing to relabel")
