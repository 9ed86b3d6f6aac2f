"""``htools hspace|hbal`` (the console script) on a Ganeti file or a simulation never sets
Django up, and prints byte for byte what Ganeti's binary and the Django management command print."""

import os
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

from capacity import htools
from tests.placement.helpers import ganeti_tool, htools_command

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "placement" / "ganeti"
CHAIN = ["--disk-template=plain", "--standard-alloc=10240,1024,1", "--tiered-alloc=102400,8192,4"]


def run_htools(*args):
    """``htools ARGS`` as a user runs it, in a fresh process, from elsewhere than the project
    (the editable install finds it); stderr carries ``-X importtime``'s module list."""
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}}
    return subprocess.run(
        [htools_command(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
        cwd=DATA,
    )


def imported(done) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize(
    "args",
    [
        ["-t", str(DATA / "mixed-states.txt"), *CHAIN, "--machine-readable"],
        [
            "--simulate=p,3,34052480,65523,24",
            "--disk-template=drbd",
            "--tiered-alloc=1048576,1024,8",
            "--machine-readable",
        ],
    ],
    ids=["file", "simulate"],
)
def test_hspace_answers_as_ganeti_without_django_or_numpy(args, capsys):
    done = run_htools("hspace", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = imported(done)
    assert "placement.ganeti.hspace" in modules
    assert not {m for m in modules if m.split(".")[0] in {"django", "numpy"}}
    # Start-up is most of a small run (Ganeti's takes 0.04 s): none of these heavy ones.
    assert not modules & {"argparse", "dataclasses", "inspect", "enum", "re", "pathlib", "typing"}
    theirs = subprocess.run([ganeti_tool("hspace"), *args], capture_output=True, text=True, timeout=120)
    assert done.stdout == theirs.stdout
    call_command("hspace", *args)  # the management command: the same implementation
    assert capsys.readouterr().out == done.stdout


def test_a_refusal_is_djangos_command_error_with_its_exit_status():
    done = run_htools("hspace", "--simulate=p,x,100g,64g,8")
    assert done.returncode == 1
    message = "--simulate: node count: cannot parse 'x' as an integer in 'p,x,100g,64g,8'"
    assert done.stderr.splitlines()[-1] == f"CommandError: {message}"
    assert not {m for m in imported(done) if m.startswith("django")}


def test_hbal_on_a_file_prints_the_same_plan_as_the_django_command(capsys):
    path = DATA / "drbd-8-nodes.txt"
    done = run_htools("hbal", "-t", str(path), "--strategy", "steepest", "-C")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not {m for m in imported(done) if m.startswith("django")}
    call_command("hbal", "-t", str(path), "--strategy", "steepest", "-C")
    assert capsys.readouterr().out == done.stdout


def test_django_options_go_through_the_management_command_to_the_same_answer():
    args = ["-t", str(DATA / "mixed-states.txt"), *CHAIN, "--machine-readable"]
    lean, django = run_htools("hspace", *args), run_htools("hspace", *args, "--verbosity=1")
    assert django.returncode == 0, django.stderr[-2000:]
    assert "django.core.management" in imported(django)
    assert django.stdout == lean.stdout


def test_the_live_inventory_and_unreadable_arguments_are_handed_to_manage_py(monkeypatch):
    import django.core.management

    handed = []
    monkeypatch.setattr(django.core.management, "execute_from_command_line", handed.append)
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE")
    assert htools.console(["hbal", "-X"]) is None
    assert htools.console(["hspace", "-t", "f.txt", "--bogus"]) is None  # Django's parser says why
    assert handed == [["manage.py", "hbal", "-X"], ["manage.py", "hspace", "-t", "f.txt", "--bogus"]]
    assert os.environ["DJANGO_SETTINGS_MODULE"] == "vclmgr.settings"


@pytest.mark.parametrize("argv", [[], ["migrate"], ["--help"]])
def test_htools_is_not_manage_py(argv, capsys):
    assert htools.console(argv) == 2
    assert capsys.readouterr().err == "usage: htools {hspace,hbal,hsqueeze} [options]\n"


@pytest.mark.parametrize(
    "argv, lean",
    [
        (["hspace", "--simulate=p,3,1g,1g,1"], True),
        (["hspace", "-t", "f.txt"], True),
        (["hspace", "--ganeti-file=f.txt"], True),
        (["hbal", "-tf.txt"], True),
        (["hsqueeze", "-t", "f.txt"], True),
        (["hspace", "--standard-alloc=1,1,1"], False),  # the live inventory needs the database
        (["hbal", "--simulate=p,3,1g,1g,1"], False),  # not an hbal option: Django's error
        (["hspace", "-t", "f.txt", "-v", "2"], False),  # Django's own options
        (["hspace", "-t", "f.txt", "--settings=x"], False),
        (["hspace", "-t", "f.txt", "--help"], False),
        (["migrate"], False),
        ([], False),
    ],
)
def test_which_arguments_skip_django(argv, lean):
    assert htools.runs_without_django(argv) is lean


def test_arguments_that_do_not_parse_are_left_to_django():
    assert htools.main(["hspace", "-t", "f.txt", "--bogus"], from_manage=True) is None


@pytest.mark.parametrize(
    "name, args",
    [
        ("hspace", []),
        ("hspace", ["--simulate=p,3,1g,1g,1", "--simulate", "p,2,1g,1g,1", "--disk-template=drbd"]),
        ("hspace", ["-t", "f.txt", "--tiered-alloc", "1,2,3", "--standard-alloc=4,5,6", "--machine-readable"]),
        ("hspace", ["-tf.txt", "--no-capacity-checks", "--json", "--at", "2026-12-01 14:00"]),
        ("hbal", ["-t", "f.txt", "-C", "--strategy", "steepest", "--max-moves", "3", "-G", "g1"]),
        ("hbal", ["-t", "f.txt", "-C", "out.sh", "--max-moves=0", "--json"]),
        ("hbal", ["-t", "f.txt", "-Cout.sh", "--group=g2", "--strategy=lazy"]),
        ("hsqueeze", ["-t", "f.txt", "--target-util", "1.5", "--minimal-resources=0.5"]),
        ("hsqueeze", ["--ganeti-file=f.txt", "--target-resources=3"]),
    ],
)
def test_plain_arguments_are_read_as_argparse_reads_them(name, args):
    import argparse

    parser = argparse.ArgumentParser()
    htools.add_arguments(name, parser)
    assert htools.parse_simple(name, args) == vars(parser.parse_args(args))


@pytest.mark.parametrize(
    "name, args",
    [
        ("hspace", ["--sim=p,3,1g,1g,1"]),  # an abbreviation
        ("hspace", ["-t", "f.txt", "--bogus"]),
        ("hspace", ["-t"]),
        ("hspace", ["-t", "--json"]),
        ("hspace", ["f.txt"]),
        ("hbal", ["-t", "f.txt", "--max-moves", "-5"]),  # argparse takes it as a value
        ("hbal", ["-t", "f.txt", "--max-moves=x"]),
        ("hbal", ["-t", "f.txt", "--strategy=best"]),
        ("hbal", ["-t=f.txt"]),
        ("hspace", ["--json=1"]),
        ("hspace", ["--", "-t"]),
    ],
)
def test_anything_else_is_left_to_argparse(name, args):
    assert htools.parse_simple(name, args) is None


def test_the_help_lists_the_disk_templates_of_the_core():
    from placement.ganeti.types import DISK_TEMPLATES

    assert htools._DISK_TEMPLATES == ", ".join(DISK_TEMPLATES)
