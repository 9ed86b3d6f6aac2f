"""``manage.py ldap_retire``: deactivate the accounts the directory made whose entries it no
longer has (``accounts.signon.retire_gone``); ``--every MINUTES`` schedules it in the job
workers instead (0 removes the schedule). A directory error exits 1 with nothing changed after it."""

from django.core.management.base import BaseCommand, CommandError

from core import periodic

SCHEDULE = "directory: retire accounts gone from it"


class Command(BaseCommand):
    help = "Deactivate the accounts LDAP sign-on made whose directory entries are gone."

    def add_arguments(self, parser):
        parser.add_argument("--every", type=int, metavar="MINUTES", help="schedule the sweep instead (0: unschedule)")

    def handle(self, *args, every, **options):
        import ldap

        from accounts import signon

        if every is not None:
            periodic.ensure_schedule(SCHEDULE, "accounts.signon.retire_gone", every)
            self.stdout.write(f"scheduled every {every} minutes" if every > 0 else "schedule removed")
            return
        try:
            retired = signon.retire_gone()
        except ldap.LDAPError as exc:
            raise CommandError(f"the directory did not answer properly, sweep stopped: {exc}") from exc
        self.stdout.write(f"retired {len(retired)}: {', '.join(retired)}" if retired else "retired 0")
