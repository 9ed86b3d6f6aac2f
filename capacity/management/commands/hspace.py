"""``manage.py hspace``: capacity planning, as Ganeti's hspace (same input, same HTS_ keys).

The work is `capacity.htools` (shared with the Django-free path that the htools command
takes for ``-t FILE`` and ``--simulate``); this adds the live inventory as a source."""

from django.core.management.base import BaseCommand, CommandError

from capacity import htools

from ._ganeti_input import ganeti_cluster


class Command(BaseCommand):
    help = "How many more instances of a spec fit (tiered and standard allocation), and what runs out first."

    def add_arguments(self, parser):
        htools.add_arguments("hspace", parser)

    def handle(self, *args, **opts):
        def load(template, hold_future):
            return ganeti_cluster(opts, template=template, hold_future=hold_future)

        try:
            htools.run("hspace", opts, load, self.stdout.write)
        except htools.CommandFailed as error:
            raise CommandError(str(error)) from None
