"""``manage.py environment``: a template written in YAML, listed, shown and deleted."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from environments.models import EnvironmentTemplate

pytestmark = pytest.mark.django_db

NETLAB = """
name: netlab
description: A router between two client networks.
members:
  - name: router
    image: vyos
    entry: true
    networks: [left, right]
  - name: client
    image: debian-12
    count: 2
    memory_mib: 1024
    networks: [left]
  - name: server
    image: debian-12
    networks: [right]
networks:
  - name: left
    cidr: 192.168.10.0/24
  - name: right
"""


def run(*args):
    out = StringIO()
    call_command("environment", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def netlab_file(tmp_path, debian, router_image):
    path = tmp_path / "env.yaml"
    path.write_text(NETLAB)
    return path


def test_it_creates_a_template_from_a_file_and_shows_its_machines(netlab_file, alice):
    assert run("create", "--from-file", str(netlab_file), "--user", "alice") == "created netlab (4 machines)\n"
    template = EnvironmentTemplate.objects.get(name="netlab")
    assert template.owner == alice and template.networks.get(name="right").cidr == "192.168.0.0/24"
    shown = run("show", "netlab")
    assert "client-2" in shown and "1024 MiB" in shown and "router" in shown and "(entry)" in shown
    assert json.loads(run("show", "netlab", "--json"))["machines"] == 4


def test_list_shows_every_template_or_those_a_user_may_use(netlab_file, alice, bob):
    run("create", "--from-file", str(netlab_file), "--user", "alice")
    assert "netlab" in run("list") and "alice" in run("list")
    assert run("list", "--user", "bob") == ""
    assert json.loads(run("list", "--user", "alice", "--json")) == [
        {"name": "netlab", "machines": 4, "visibility": "restricted", "owner": "alice"}
    ]


def test_a_broken_rule_is_refused_with_the_services_words(tmp_path, alice, debian):
    path = tmp_path / "env.yaml"
    path.write_text("name: two\nmembers:\n  - {name: a, image: debian-12}\n  - {name: b, image: debian-12}\n")
    with pytest.raises(CommandError) as caught:
        run("create", "--from-file", str(path), "--user", "alice")
    assert "no member is the entry point" in str(caught.value) and "member a is on no network" in str(caught.value)
    assert not EnvironmentTemplate.objects.exists()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- a\n", "must be one mapping"),
        ("name: x\nmembrs: []\n", "unknown field membrs"),
        ("name: x\nmembers:\n  - {name: a, image: debian-12, ram: 4}\n", "member 1: unknown field ram"),
        ("name: x\nmembers: [&a {name: a}, *a]\n", "refers to anchor"),
        ("name: [x\n", "not YAML"),
    ],
)
def test_a_file_of_the_wrong_shape_is_refused_saying_where(tmp_path, alice, debian, text, words):
    path = tmp_path / "env.yaml"
    path.write_text(text)
    with pytest.raises(CommandError) as caught:
        run("create", "--from-file", str(path), "--user", "alice")
    assert words in str(caught.value)


def test_delete_acts_as_the_user_named(netlab_file, alice, bob):
    run("create", "--from-file", str(netlab_file), "--user", "alice")
    with pytest.raises(CommandError, match="only its owner"):
        run("delete", "netlab", "--user", "bob")
    assert run("delete", "netlab", "--user", "alice") == "deleted netlab\n"
    assert not EnvironmentTemplate.objects.exists()
