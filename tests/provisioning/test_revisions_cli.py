"""``manage.py revision``: add, list, roll out, roll back, retire and delete from the command line."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from provisioning import revisions


def run(*args):
    out = StringIO()
    call_command("revision", *args, stdout=out)
    return out.getvalue()


def test_a_revision_from_add_to_delete(image):
    assert "revision 2 added (testing)" in run(
        "add", "debian-12", "--variant", "sim,sim,sim://library/v2", "--comment", "patched"
    )
    assert "revision 2 is production" in run("production", "debian-12", "2")
    assert "revision 1 is production" in run("production", "debian-12", "1")  # the roll-back
    assert "revision 2 is retired" in run("retire", "debian-12", "2")
    listed = json.loads(run("list", "debian-12", "--json"))
    assert [(r["number"], r["state"], r["comment"]) for r in listed] == [
        (1, "production", ""),
        (2, "retired", "patched"),
    ]
    assert "retired" in run("list", "debian-12")
    assert "deleted" in run("delete", "debian-12", "2")
    assert list(image.revisions.values_list("number", flat=True)) == [1]


def test_the_cli_reports_bad_input(image):
    with pytest.raises(CommandError, match="no image named"):
        run("list", "nope")
    with pytest.raises(CommandError, match="no revision 9"):
        run("retire", "debian-12", "9")
    with pytest.raises(CommandError, match="TYPE,FORMAT,LOCATION"):
        run("add", "debian-12", "--variant", "sim")
    with pytest.raises(CommandError, match="format"):
        run("add", "debian-12", "--variant", "kvm,vmdk,/x.vmdk")
    with pytest.raises(CommandError, match="make another one production first"):
        run("delete", "debian-12", "1")
    assert revisions.production(image).number == 1 and image.revisions.count() == 1
