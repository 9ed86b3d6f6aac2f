"""The CLI: import_hosts, export_hosts and node (list / modify, like gnt-node)."""

import io
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from core.models import ObjectChange
from inventory.models import Hypervisor
from tests import processes
from tests.inventory.conftest import host_row, to_csv


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def canonical_rows(count):
    """Rows exactly as export_hosts --no-id writes them (sorted by name, canonical cells)."""
    rows = []
    for i in range(1, count + 1):
        row = host_row(i, group="lab" if i % 3 else "", tags="gpu, ssd" if i % 5 == 0 else "")
        if i <= 16:
            row.update(blade_center="bc1", slot=i)
        if i % 7 == 0:
            row.update(state="drained", state_reason="'=formula-looking reason" if i % 14 == 0 else "maintenance")
        if i % 11 == 0:
            row.update(credential="root-ssh", max_vms=30, cpu_ratio=2.5, reserved_memory_mib=2048)
        rows.append(row)
    return rows


def test_import_then_export_of_1000_rows_reproduces_the_input(db, tmp_path, group, chassis, credential):
    source = tmp_path / "hosts.csv"
    source.write_bytes(to_csv(canonical_rows(1000)))
    out, err = run("import_hosts", str(source))
    assert out.splitlines()[0] == "created 1000, updated 0, errors 0 (0 unchanged)" and err == ""
    assert Hypervisor.objects.count() == 1000
    assert Hypervisor.objects.get(name="h00014").state_reason == "=formula-looking reason"

    exported = tmp_path / "out.csv"
    run("export_hosts", "--no-id", "--output", str(exported))
    assert exported.read_bytes() == source.read_bytes()

    with_ids = tmp_path / "with-ids.csv"
    run("export_hosts", "-o", str(with_ids))
    out, _ = run("import_hosts", str(with_ids))
    assert out.startswith("created 0, updated 0, errors 0 (1000 unchanged)")


def test_import_hosts_reports_errors_and_writes_nothing(db, tmp_path):
    source = tmp_path / "hosts.csv"
    source.write_bytes(to_csv([host_row(1), host_row(2, memory_mib="lots"), host_row(3, driver="xen")]))
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("import_hosts", str(source), stdout=out, stderr=err)
    assert refused.value.returncode == 1 and "nothing was written" in str(refused.value)
    assert out.getvalue().startswith("created 1, updated 0, errors 2")
    assert err.getvalue().splitlines() == [
        "Row 2 memory_mib: must be a positive integer",
        "Row 3 driver: unknown driver 'xen' (use sim, libvirt or vmware)",
    ]
    assert Hypervisor.objects.count() == 0


def test_import_hosts_dry_run(db, tmp_path):
    source = tmp_path / "hosts.json"
    source.write_text('[{"name": "j1", "address": "10.0.0.1", "cpus": 2, "memory_mib": 512, "disk_gib": 5}]')
    out, _ = run("import_hosts", str(source), "--dry-run")
    assert out.splitlines() == ["created 1, updated 0, errors 0 (0 unchanged)", "dry run: nothing was written"]
    assert not Hypervisor.objects.exists()


def test_import_hosts_logs_the_cli_as_actor(db, tmp_path):
    source = tmp_path / "h.yaml"
    source.write_text("- {name: y1, address: 10.0.0.9, cpus: 2, memory_mib: 512, disk_gib: 5}\n")
    run("import_hosts", str(source), "--reason", "rack 12 arrived")
    change = ObjectChange.objects.get(object_repr="y1")
    assert (change.actor, change.reason) == ("cli", "rack 12 arrived")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.csv"], "cannot read missing.csv"),
        (["hosts.txt"], "cannot tell the format"),
    ],
)
def test_import_hosts_file_problems(db, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.txt").write_text("x")
    with pytest.raises(CommandError, match=message):
        run("import_hosts", *args)


@override_settings(INVENTORY_IMPORT_MAX_BYTES=100)
def test_import_hosts_refuses_a_file_over_the_limit(db, tmp_path):
    source = tmp_path / "big.csv"
    source.write_bytes(to_csv([host_row(i) for i in range(5)]))
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("import_hosts", str(source), stdout=io.StringIO(), stderr=err)
    assert "over the limit of 100 bytes (INVENTORY_IMPORT_MAX_BYTES)" in err.getvalue()


def test_export_hosts_filters_and_formats(db, tmp_path, make_host, group):
    make_host(name="in-group", group=group, tags=["gpu"])
    make_host(name="elsewhere")
    target = tmp_path / "hosts.yaml"
    run("export_hosts", "-o", str(target), "--group", "lab")
    text = target.read_text()
    assert "in-group" in text and "elsewhere" not in text and text.startswith("- id:")
    with pytest.raises(CommandError, match="group"):
        run("export_hosts", "--group", "nope", "-o", str(tmp_path / "x.csv"))


@pytest.mark.slow
def test_the_exit_status_is_0_on_success_and_1_when_rows_are_rejected(transactional_db, tmp_path):
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_bytes(to_csv([host_row(1)]))
    bad.write_bytes(to_csv([host_row(2, cpus="-1")]))
    env = processes.child_env()
    manage = [sys.executable, "manage.py", "import_hosts"]
    ok = subprocess.run([*manage, str(good)], cwd=processes.ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [*manage, str(bad)], cwd=processes.ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1
    assert "Row 1 cpus: must be a positive integer" in refused.stderr
    assert list(Hypervisor.objects.values_list("name", flat=True)) == ["h00001"]


def test_node_modify_drains_offlines_and_onlines(db, make_host):
    host = make_host(name="n1")
    out, _ = run("node", "modify", "n1", "--drained=yes", "--reason", "firmware upgrade")
    assert out.strip() == "n1: drained"
    host.refresh_from_db()
    assert (host.state, host.state_reason, host.state_changed_by) == ("drained", "firmware upgrade", "cli")
    run("node", "modify", "n1", "--offline=yes", "--reason", "PSU")
    assert Hypervisor.objects.get(pk=host.pk).state == "offline"
    run("node", "modify", "n1", "--offline=no", "--reason", "fixed")
    assert Hypervisor.objects.get(pk=host.pk).state == "online"
    out, _ = run("node", "modify", "n1", "--drained=no", "--reason", "fixed")
    assert "nothing changed" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["modify", "n1", "--reason", "x"], "give --drained=yes|no or --offline=yes|no"),
        (["modify", "n1", "--drained=yes", "--offline=yes", "--reason", "x"], "either drained or offline"),
        (["modify", "ghost", "--drained=yes", "--reason", "x"], "no hypervisor named 'ghost'"),
        (["modify", "n1", "--drained=yes", "--reason", "  "], "required: say why"),
        (["modify", "n1", "--drained=yes"], "--reason"),
    ],
)
def test_node_modify_refuses_bad_input(db, make_host, args, message):
    make_host(name="n1")
    with pytest.raises(CommandError, match=message):
        run("node", *args)
    assert Hypervisor.objects.get(name="n1").state == "online"


def test_node_list(db, make_host, chassis, group):
    make_host(name="a1", blade_center=chassis, slot=2, group=group)
    make_host(name="b2")
    run("node", "modify", "b2", "--drained=yes", "--reason", "disk swap")
    out, _ = run("node", "list")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["Node", "State", "Group"]
    assert lines[1].split()[:4] == ["a1", "online", "lab", "bc1/2"]
    assert lines[2].split()[:2] == ["b2", "drained"] and lines[2].endswith("disk swap")
    out, _ = run("node", "list", "--state", "drained")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["b2"]
