"""``manage.py revision template|publish|discard|test``: an image's template from the command line."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from reservations import services
from reservations.models import Reservation


def run(*args):
    out = StringIO()
    call_command("revision", *args, stdout=out)
    return out.getvalue()


def test_a_maintainer_runs_the_loop_from_the_command_line(sim_host, image, maya, sync_jobs):
    assert "template started" in run("template", "debian-12", "--as", "maya")
    sync_jobs.drain()
    template = services.open_template(image)
    assert template.status == "ready" and template.user == maya
    assert "new production revision" in run("publish", "debian-12", "--as", "maya", "--production", "--comment", "x")
    sync_jobs.drain()
    assert image.revisions.get(number=2).state == "production" and services.open_template(image) is None
    assert "revision 1 reserved to test" in run("test", "debian-12", "1", "--as", "maya", "--duration", "30")
    sync_jobs.drain()
    tried = Reservation.objects.filter(template_of=None).select_related("vm").get()
    assert tried.vm.revision.number == 1


def test_discard_from_the_command_line(sim_host, image, maya, sync_jobs):
    run("template", "debian-12", "--as", "maya")
    sync_jobs.drain()
    assert "template discarded" in run("discard", "debian-12", "--as", "maya")
    sync_jobs.drain()
    assert services.open_template(image) is None and image.revisions.count() == 1


def test_the_command_line_reports_refusals(sim_host, image, maya, student, sync_jobs):
    with pytest.raises(CommandError, match="has no template"):
        run("publish", "debian-12", "--as", "maya")
    with pytest.raises(CommandError, match="only an image maintainer"):
        run("template", "debian-12", "--as", student.username)
    run("template", "debian-12", "--as", "maya")
    with pytest.raises(CommandError, match="has a template already"):
        run("template", "debian-12", "--as", "maya")
    with pytest.raises(CommandError, match="no user named"):
        run("discard", "debian-12", "--as", "nobody")
