"""Bulk import of hypervisors: every bad input gets a clear message and writes nothing."""

import io
import json
import time
import tracemalloc
import zipfile

import openpyxl
import pytest
import yaml
from django.test import override_settings

from core.models import Event, ObjectChange
from inventory import formats, services
from inventory.models import Hypervisor
from tests.inventory.conftest import TEST, host_row, import_csv, to_csv


def written():
    return Hypervisor.objects.count(), ObjectChange.objects.count(), Event.objects.count()


def assert_refused(run, *expected):
    """``run()`` imports and is refused: no host, change-log row or event written, and each
    expected text in some message. Returns the report."""
    before = written()
    report = run()
    assert not report.ok and not report.committed
    messages = report.messages()
    for text in expected:
        assert any(text in m for m in messages), f"{text!r} not in {messages}"
    assert written() == before, "a refused import wrote (hosts, changes, events)"
    return report


# --- the good path --------------------------------------------------------------------


def test_it_creates_hosts_with_tags_log_and_events(db, group, chassis, credential):
    rows = [
        host_row(i, group="lab", blade_center="bc1", slot=i, credential="root-ssh", tags="gpu, ssd")
        for i in range(1, 4)
    ]
    report = import_csv(rows)
    assert report.committed, report.messages()
    assert report.totals == {"create": 3, "update": 0, "unchanged": 0, "reject": 0}
    host = Hypervisor.objects.get(name="h00002")
    assert (host.group, host.blade_center, host.slot, host.credential) == (group, chassis, 2, credential)
    assert sorted(t.name for t in host.tags.all()) == ["gpu", "ssd"]
    change = ObjectChange.objects.get(object_id=str(host.pk), content_type__model="hypervisor")
    assert change.action == "create" and change.actor == "test" and change.changes["memory_mib"] == [None, 131072]
    assert change.reason == "import of test.csv"
    chassis_event = Event.objects.get(topic=f"bladecenter.{chassis.pk}")
    assert sorted(s["slot"] for s in chassis_event.data["slots"]) == [1, 2, 3]
    assert Event.objects.get(topic="admin", kind="hypervisor.imported").data["created"] == 3


def test_a_dry_run_reports_and_writes_nothing(db):
    report = import_csv([host_row(1), host_row(2)], dry_run=True)
    assert report.ok and not report.committed
    assert [r.action for r in report.rows] == ["create", "create"]
    assert Hypervisor.objects.count() == 0 and not ObjectChange.objects.exists() and not Event.objects.exists()


def test_an_existing_name_means_update_and_an_id_means_update_too(db, make_host):
    a, b = make_host(name="alpha", cpus=8), make_host(name="beta", cpus=8)
    report = import_csv([host_row(1, name="alpha", cpus=12)])
    assert report.committed and report.totals["update"] == 1
    a.refresh_from_db()
    assert a.cpus == 12
    change = ObjectChange.objects.filter(object_id=str(a.pk)).first()
    assert change.action == "update" and change.changes["cpus"] == [8, 12]
    rows = [{"id": b.pk, "name": "beta-renamed", "cpus": 4}]
    report = services.import_hypervisors(to_csv(rows, ["id", "name", "cpus"]), "csv", actor=TEST)
    assert report.committed, report.messages()
    b.refresh_from_db()
    assert (b.name, b.cpus, b.memory_mib) == ("beta-renamed", 4, 65536)  # other columns untouched
    assert Event.objects.filter(topic=f"hypervisor.{b.pk}", kind="hypervisor.changed").exists()


def test_unchanged_rows_are_reported_and_not_written(db, make_host):
    host = make_host(name="alpha")
    before = host.updated
    data = services.export_hypervisors("csv")
    report = services.import_hypervisors(data, "csv", actor=TEST)
    assert report.ok and report.totals["unchanged"] == 1
    host.refresh_from_db()
    assert host.updated == before


def test_a_state_change_by_import_records_who(db, make_host):
    host = make_host(name="alpha")
    report = services.import_hypervisors(
        to_csv([{"name": "alpha", "state": "drained", "state_reason": "rack move"}]), "csv", actor=TEST
    )
    assert report.committed
    host.refresh_from_db()
    assert (host.state, host.state_reason, host.state_changed_by) == ("drained", "rack move", "test")
    assert Event.objects.filter(topic=f"hypervisor.{host.pk}", kind="hypervisor.state").exists()


@pytest.mark.parametrize("fmt", ["csv", "xlsx", "json", "yaml"])
def test_every_format_round_trips_unchanged(db, make_host, group, chassis, credential, fmt):
    make_host(
        name="alpha",
        group=group,
        blade_center=chassis,
        slot=3,
        credential=credential,
        tags=["a b", "gpu"],
        max_vms=20,
        cpu_ratio=2.5,
    )
    make_host(name="beta")
    services.set_state(Hypervisor.objects.get(name="beta"), "drained", '=HYPERLINK("http://evil")', actor=TEST)
    data = services.export_hypervisors(fmt)
    report = services.import_hypervisors(data, fmt, actor=TEST)
    assert report.ok and report.totals == {"create": 0, "update": 0, "unchanged": 2, "reject": 0}, report.messages()


# --- formula injection ------------------------------------------------------------------


def test_spreadsheet_exports_escape_formulas_and_import_restores_them(db, make_host):
    host = make_host(name="alpha")
    for reason in ("=1+1", "+cmd", "-2", "@SUM(A1)", "'=already quoted"):
        services.set_state(host, "drained", reason, actor=TEST)
        csv_text = services.export_hypervisors("csv").decode()
        assert f",'{reason}," in csv_text or f',"\'{reason}",' in csv_text
        book = openpyxl.load_workbook(__import__("io").BytesIO(services.export_hypervisors("xlsx")))
        cells = [c.value for c in next(book.active.iter_rows(min_row=2, max_row=2))]
        assert "'" + reason in cells and not any(c.data_type == "f" for c in book.active[2])
        assert services.import_hypervisors(csv_text.encode(), "csv", actor=TEST).totals["unchanged"] == 1
    # JSON is not a spreadsheet: no escaping there.
    assert json.loads(services.export_hypervisors("json"))[0]["state_reason"] == "'=already quoted"


# --- bad input: one test per case of the issue ----------------------------------------


def test_it_rejects_duplicate_names_inside_the_file(db):
    assert_refused(
        lambda: import_csv([host_row(1, name="dup"), host_row(2), host_row(3, name="dup")]),
        "Row 3 name: 'dup' already appears in row 1",
    )
    assert Hypervisor.objects.count() == 0


def test_it_rejects_a_name_clashing_with_the_database(db, make_host):
    make_host(name="bc1-s01")
    assert_refused(
        lambda: import_csv([host_row(1, name="BC1-S01")]),
        "Row 1 name: a hypervisor with this name already exists as 'bc1-s01'",
    )
    existing = make_host(name="other")
    rows = [{"id": existing.pk, "name": "bc1-s01"}]
    assert_refused(
        lambda: services.import_hypervisors(to_csv(rows, ["id", "name"]), "csv", actor=TEST),
        "Row 1 name: a hypervisor with this name already exists",
    )
    assert Hypervisor.objects.filter(name="other").exists()


def test_it_rejects_the_same_existing_host_twice(db, make_host):
    make_host(name="alpha")
    assert_refused(
        lambda: import_csv([host_row(1, name="alpha", cpus=2), host_row(2, name="alpha", cpus=3)]),
        "Row 2 name: 'alpha' already appears in row 1",
    )
    assert Hypervisor.objects.get(name="alpha").cpus == 16


def test_it_rejects_slot_collisions_in_the_file_and_with_the_database(db, chassis, make_host):
    make_host(name="in-slot-5", blade_center=chassis, slot=5)
    assert_refused(
        lambda: import_csv(
            [
                host_row(1, blade_center="bc1", slot=1),
                host_row(2, blade_center="bc1", slot=1),
                host_row(3, blade_center="bc1", slot=5),
            ]
        ),
        "Row 2 slot: slot 1 of bc1 is already taken by row 1 (h00001)",
        "Row 3 slot: slot 5 of bc1 is already taken by in-slot-5",
    )
    assert Hypervisor.objects.count() == 1


def test_it_rejects_a_slot_outside_the_chassis(db, chassis):
    assert_refused(
        lambda: import_csv(
            [
                host_row(1, blade_center="bc1", slot=17),
                host_row(2, blade_center="bc1", slot=0),
                host_row(3, slot=4),
                host_row(4, blade_center="bc1"),
            ]
        ),
        "Row 1 slot: bc1 has slots 1–16, not 17",
        "Row 2 slot: must be a positive integer",
        "Row 3 slot: a slot needs a blade_center",
        "Row 4 slot: required: which slot of bc1",
    )
    assert Hypervisor.objects.count() == 0


@pytest.mark.parametrize(
    ("column", "label"), [("group", "node group"), ("blade_center", "blade center"), ("credential", "credential")]
)
def test_it_rejects_unknown_foreign_keys(db, group, chassis, credential, column, label):
    assert_refused(
        lambda: import_csv([host_row(1, **{column: "nope", "slot": 1 if column == "blade_center" else ""})]),
        f"Row 1 {column}: no {label} named 'nope'",
    )


def test_it_suggests_a_name_differing_in_case(db, group):
    assert_refused(lambda: import_csv([host_row(1, group="LAB")]), "no node group named 'LAB' (did you mean 'lab'?)")


@pytest.mark.parametrize("value", ["-4", "abc", "1.5", "0", "", "1e3", "99999999999"])
def test_it_rejects_negative_or_non_numeric_capacity(db, value):
    expected = "Row 2 memory_mib: required" if value == "" else "Row 2 memory_mib: must be"
    report = assert_refused(lambda: import_csv([host_row(1), host_row(2, memory_mib=value)]), expected)
    assert report.rows[0].action == "create" and report.rows[1].action == "reject"
    assert Hypervisor.objects.count() == 0


def test_it_rejects_bad_ratios_and_reserved_amounts(db):
    assert_refused(
        lambda: import_csv(
            [
                host_row(1, cpu_ratio="-1"),
                host_row(2, disk_ratio="nan"),
                host_row(3, reserved_cpus=64),
                host_row(4, disk_gib=-1),
            ]
        ),
        "Row 1 cpu_ratio: must be a number between 0.01 and 1000",
        "Row 2 disk_ratio: must be",
        "Row 3 reserved_cpus: cannot exceed cpus (32)",
        "Row 4 disk_gib: must be a whole number, 0 or more",
    )


@pytest.mark.parametrize("address", ["10.0.0.300", "10.0.0", "::zz", "bad_host!", "-leading.example"])
def test_it_rejects_an_invalid_ip_address(db, address):
    assert_refused(lambda: import_csv([host_row(1, address=address)]), "Row 1 address:")


@pytest.mark.parametrize(
    ("driver", "uri", "message"),
    [
        ("libvirt", "qemu+ssh://[::1/system", "cannot parse"),
        ("libvirt", "not a uri", "must not contain spaces"),
        ("libvirt", "just-text", "cannot parse 'just-text': expected scheme://host/path"),
        ("libvirt", "https://esx1/sdk", "scheme 'https' does not suit the libvirt driver (use bhyve, ch, lxc, qemu"),
        ("vmware", "qemu:///system", "scheme 'qemu' does not suit the vmware driver (use http, https)"),
        ("libvirt", "qemu+ssh://host:99999/system", "cannot parse"),
    ],
)
def test_it_rejects_an_unparsable_or_unsuitable_uri(db, driver, uri, message):
    assert_refused(lambda: import_csv([host_row(1, driver=driver, uri=uri)]), f"Row 1 uri: {message}")


def test_it_rejects_an_unknown_driver(db):
    assert_refused(
        lambda: import_csv([host_row(1, driver="xen")]),
        "Row 1 driver: unknown driver 'xen' (use sim, libvirt or vmware)",
    )


def test_it_rejects_an_unknown_id(db):
    assert_refused(
        lambda: services.import_hypervisors(to_csv([{"id": 4242, "name": "x"}], ["id", "name"]), "csv", actor=TEST),
        "Row 1 id: no hypervisor has id 4242",
    )


def test_it_rejects_an_unknown_column(db):
    report = assert_refused(
        lambda: import_csv([{**host_row(1), "memory_mb": 5}], columns=["name", "address", "memory_mb"]),
        "unknown column 'memory_mb'",
    )
    assert report.rows == []


def test_it_rejects_an_empty_file(db):
    for data in (b"", b"  \n\n"):
        assert_refused(lambda data=data: services.import_hypervisors(data, "csv", actor=TEST), "the file is empty")


def test_it_rejects_a_header_only_file(db):
    assert_refused(
        lambda: services.import_hypervisors(b"name,address,cpus\n", "csv", actor=TEST),
        "a header but no rows",
    )
    assert_refused(lambda: services.import_hypervisors(b"[]", "json", actor=TEST), "the file has no rows")


def test_it_rejects_a_file_in_the_wrong_encoding(db):
    data = "name,address,driver,cpus,memory_mib,disk_gib\nhôte1,10.0.0.1,sim,4,1024,10\n".encode("latin-1")
    assert_refused(
        lambda: services.import_hypervisors(data, "csv", actor=TEST),
        "not UTF-8 text (byte 0xf4 at position",
    )
    assert_refused(lambda: services.import_hypervisors(b"\x00\x01binary", "csv", actor=TEST), "NUL bytes")
    assert_refused(lambda: services.import_hypervisors(b"not a zip", "xlsx", actor=TEST), "not an XLSX workbook")
    assert_refused(lambda: services.import_hypervisors(b"{oops", "json", actor=TEST), "not valid JSON")
    assert_refused(lambda: services.import_hypervisors(b"- a: [", "yaml", actor=TEST), "not valid YAML")
    assert_refused(
        lambda: services.import_hypervisors(b'{"name": "x"}', "json", actor=TEST),
        "must be a list of objects",
    )


def test_a_utf8_file_with_a_byte_order_mark_is_fine(db):
    data = "\ufeffname,address,cpus,memory_mib,disk_gib,state_reason\nh1,10.0.0.1,4,1024,10,café ☕\n".encode()
    assert services.import_hypervisors(data, "csv", actor=TEST).committed
    assert Hypervisor.objects.get(name="h1").state_reason == "café ☕"


@override_settings(INVENTORY_IMPORT_MAX_BYTES=1000)
def test_it_rejects_a_file_over_the_size_limit(db):
    data = to_csv([host_row(i) for i in range(20)])
    assert_refused(
        lambda: services.import_hypervisors(data, "csv", actor=TEST),
        f"the file is {len(data):,} bytes, over the limit of 1,000 bytes (INVENTORY_IMPORT_MAX_BYTES)",
    )


def test_it_refuses_a_100000_row_file_quickly(db):
    data = (
        "name,address,driver,cpus,memory_mib,disk_gib,tags\n"
        + "".join(
            f'host-{i:06d},10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255},libvirt,32,131072,2000,"a, b"\n'
            for i in range(100_000)
        )
    ).encode()
    start = time.monotonic()
    report = services.import_hypervisors(data, "csv", actor=TEST)
    assert report.messages() == [
        "the file has more than 20,000 rows, the limit for one import (INVENTORY_IMPORT_MAX_ROWS): "
        "split it into smaller files"
    ]
    assert Hypervisor.objects.count() == 0 and time.monotonic() - start < 10


@override_settings(INVENTORY_IMPORT_MAX_BYTES=100 * 1024 * 1024)
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_json_and_yaml_over_the_row_limit_are_refused_by_count(db, fmt):
    rows = [{"name": f"h{i}"} for i in range(20_001)]
    data = json.dumps(rows).encode() if fmt == "json" else yaml.dump(rows, Dumper=yaml.CSafeDumper).encode()
    assert_refused(lambda: services.import_hypervisors(data, fmt, actor=TEST), "more than 20,000 rows")


@override_settings(INVENTORY_IMPORT_MAX_ROWS=3)
def test_the_row_limit_is_configurable_and_counts_xlsx_rows_too(db):
    rows = [host_row(i) for i in range(4)]
    data = formats._DUMPERS["xlsx"](list(rows[0]), [list(r.values()) for r in rows])
    assert_refused(lambda: services.import_hypervisors(data, "xlsx", actor=TEST), "more than 3 rows")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_nul_character_is_refused_naming_row_and_column(db, fmt):
    rows = [host_row(1), host_row(2, state_reason="bad\x00reason")]
    data = json.dumps(rows).encode() if fmt == "json" else yaml.dump(rows, Dumper=yaml.CSafeDumper).encode()
    assert_refused(lambda: services.import_hypervisors(data, fmt, actor=TEST), "row 2 state_reason: contains a NUL")


def test_a_nul_character_in_a_csv_is_refused(db):
    data = to_csv([host_row(1, state_reason="bad\x00reason")])
    assert_refused(lambda: services.import_hypervisors(data, "csv", actor=TEST), "NUL")


def test_a_nul_character_in_imported_text_through_the_api_is_a_400(db, api, admin_user):
    text = json.dumps([host_row(1, state_reason="bad\x00reason")])
    response = api(admin_user).post("/api/v1/hypervisors/import/", {"data": text, "format": "json"}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert "row 1 state_reason: contains a NUL" in response.content.decode()
    assert Hypervisor.objects.count() == 0


def xlsx_with_blank_rows(blank):
    """An XLSX workbook (written directly: openpyxl is too slow to make a big one) with a header,
    one host and then ``blank`` rows holding only a space: small compressed, long to read."""
    sheet = [
        b'<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="http://schemas.openxmlformats.org/'
        b'spreadsheetml/2006/main"><sheetData>'
    ]
    for number, row in enumerate([["name", "address"], ["h1", "10.0.0.1"]] + [[" "]] * blank, 1):
        cells = "".join(f'<c r="{"AB"[i]}{number}" t="inlineStr"><is><t>{v}</t></is></c>' for i, v in enumerate(row))
        sheet.append(f'<row r="{number}">{cells}</row>'.encode())
    sheet.append(b"</sheetData></worksheet>")
    ns = "http://schemas.openxmlformats.org"
    rel = f"{ns}/officeDocument/2006/relationships"
    parts = {
        "[Content_Types].xml": f'<Types xmlns="{ns}/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.'
        'spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/></Types>',
        "_rels/.rels": f'<Relationships xmlns="{ns}/package/2006/relationships"><Relationship Id="r1" '
        f'Type="{rel}/officeDocument" Target="xl/workbook.xml"/></Relationships>',
        "xl/workbook.xml": f'<workbook xmlns="{ns}/spreadsheetml/2006/main" xmlns:r="{rel}"><sheets>'
        '<sheet name="hosts" sheetId="1" r:id="r1"/></sheets></workbook>',
        "xl/_rels/workbook.xml.rels": f'<Relationships xmlns="{ns}/package/2006/relationships"><Relationship '
        f'Id="r1" Type="{rel}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>',
        "xl/worksheets/sheet1.xml": b"".join(sheet),
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as book:
        for name, text in parts.items():
            book.writestr(name, text)
    return out.getvalue()


@override_settings(INVENTORY_IMPORT_MAX_ROWS=1000)
@pytest.mark.parametrize(
    ("blank", "message"),
    [(50_000, "more than 1,000 rows (blank rows count too)"), (300_000, "bytes of XML uncompressed")],
    ids=["rows", "inflated"],
)
def test_a_small_xlsx_of_many_blank_rows_is_refused_quickly(db, blank, message):
    data = xlsx_with_blank_rows(blank)
    assert len(data) < 3 * 1024 * 1024  # the size of the upload that took 22 s of CPU
    start = time.monotonic()
    assert_refused(lambda: services.import_hypervisors(data, "xlsx", actor=TEST), message)
    assert time.monotonic() - start < 2


def test_a_few_blank_xlsx_rows_are_still_skipped(db):
    report = services.import_hypervisors(xlsx_with_blank_rows(5), "xlsx", actor=TEST, dry_run=True)
    assert [row.name for row in report.rows] == ["h1"], report.messages()


SST = b'<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
STRINGS_TYPE = (
    b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-'
    b'officedocument.spreadsheetml.sharedStrings+xml"/></Types>'
)


def xlsx_with_bomb(name, head, unit, tail, inflated=100 * 2**20, declared=None):
    """An exported workbook of one host plus (or with, in place of its own) part ``name``:
    ``head``, ``unit`` repeated to ``inflated`` bytes, ``tail`` — about a thousandth of that
    compressed. ``declared`` makes the zip lie about the part's inflated size."""
    row = host_row(1)
    source = zipfile.ZipFile(io.BytesIO(formats._DUMPERS["xlsx"](list(row), [list(row.values())])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as book:
        for info in source.infolist():
            content = source.read(info)
            if info.filename == "[Content_Types].xml" and name == "xl/sharedStrings.xml":
                content = content.replace(b"</Types>", STRINGS_TYPE)
            if info.filename != name:
                book.writestr(info.filename, content)
        block = unit * (2**20 // len(unit))
        with book.open(name, "w") as part:
            part.write(head)
            for _ in range(inflated // len(block)):
                part.write(block)
            part.write(tail)
    data = bytearray(out.getvalue())
    if declared is not None:
        local = zipfile.ZipFile(io.BytesIO(data)).getinfo(name).header_offset
        central = data.rindex(name.encode()) - 46
        data[local + 22 : local + 26] = data[central + 24 : central + 28] = declared.to_bytes(4, "little")
    return bytes(data)


def import_measured(data):
    """The report of importing ``data`` (dry run) and the peak of memory allocated meanwhile."""
    tracemalloc.start()
    try:
        report = services.import_hypervisors(data, "xlsx", actor=TEST, dry_run=True)
        return report, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@override_settings(INVENTORY_IMPORT_MAX_ROWS=1000)
@pytest.mark.parametrize(
    ("name", "head", "unit", "tail", "declared", "message"),
    [
        ("xl/sharedStrings.xml", SST, b"<si><t>x</t></si>", b"</sst>", None, "shared strings are over"),
        (
            "xl/worksheets/sheet1.xml",
            b"<worksheet><sheetData>",
            b"<row/>",
            b"</sheetData></worksheet>",
            None,
            "bytes of XML uncompressed",
        ),
        (
            "xl/worksheets/sheet1.xml",
            b"<worksheet><sheetData>",
            b"<row/>",
            b"</sheetData></worksheet>",
            4000,
            "not an XLSX workbook",
        ),
        ("xl/styles.xml", b"<styleSheet>", b" ", b"</styleSheet>", None, "parts other than its cells are over"),
    ],
    ids=["shared-strings", "sheet", "sheet-lying-about-its-size", "styles"],
)
def test_a_zip_bomb_in_a_part_the_import_reads_is_refused_in_bounded_memory(
    db, name, head, unit, tail, declared, message
):
    data = xlsx_with_bomb(name, head, unit, tail, declared=declared)
    assert len(data) < 300 * 1024  # 100 MiB inflated
    report, peak = import_measured(data)
    assert not report.ok and any(message in m for m in report.messages()), report.messages()
    assert peak < 16 * 2**20, f"{peak:,} bytes allocated"
    assert Hypervisor.objects.count() == 0


SHEET = b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>'
HEADER = b'<row r="1"><c r="A1" t="inlineStr"><is><t>name</t></is></c>'


@pytest.mark.parametrize(
    ("unit", "message"),
    [(b"<c/>", "row 1 of the sheet has over 16,384 cells"), (b"<c><v>1</v>" + b" " * 100 + b"</c>", "over 1,048,576")],
    ids=["cells", "bytes"],
)
def test_a_row_too_wide_to_read_is_refused_in_bounded_memory(db, unit, message):
    # openpyxl builds a whole row before it yields it: 20 MiB of empty cells in one row, well
    # within the sheet's budget, took 48 s and 1.6 GiB.
    data = xlsx_with_bomb(
        "xl/worksheets/sheet1.xml", SHEET + HEADER, unit, b"</row></sheetData></worksheet>", 20 * 2**20
    )
    report, peak = import_measured(data)
    assert not report.ok and any(message in m for m in report.messages()), report.messages()
    assert peak < 16 * 2**20, f"{peak:,} bytes allocated"


def test_a_sheet_read_in_many_chunks_loses_no_row():
    rows = [host_row(i, state_reason="x" * (i % 300)) for i in range(3000)]  # about 3 MiB of XML
    dataset = formats.load(formats._DUMPERS["xlsx"](list(rows[0]), [list(r.values()) for r in rows]), "xlsx")
    assert [row[0] for row in dataset] == [row["name"] for row in rows]
    assert dataset[2999][dataset.headers.index("state_reason")] == "x" * 299


@pytest.mark.parametrize("name", ["docProps/core.xml", "xl/theme/theme1.xml", "xl/media/image1.png"])
def test_a_zip_bomb_in_a_part_the_import_does_not_read_is_never_inflated(db, name):
    data = xlsx_with_bomb(name, b"<a>", b" ", b"</a>")
    report, peak = import_measured(data)
    assert report.ok and [row.name for row in report.rows] == ["h00001"], report.messages()
    assert peak < 16 * 2**20, f"{peak:,} bytes allocated"


def test_ragged_csv_rows_get_a_clear_message(db):
    data = b"name,address\nh1,10.0.0.1,extra\n"
    assert_refused(
        lambda: services.import_hypervisors(data, "csv", actor=TEST), "row 1 has 3 cells but the header names 2 columns"
    )
    assert_refused(lambda: services.import_hypervisors(b"name,,x\nh1,1,2\n", "csv", actor=TEST), "column 2 has no name")
    assert_refused(
        lambda: services.import_hypervisors(b"name,name\nh1,h2\n", "csv", actor=TEST),
        "'name' appears twice",
    )


def test_missing_required_columns_are_reported_per_row(db):
    assert_refused(
        lambda: services.import_hypervisors(b"name,address\nh1,10.0.0.1\n", "csv", actor=TEST),
        "Row 1 cpus: required: add a 'cpus' column",
    )


def test_one_bad_row_among_many_writes_nothing(db, make_host):
    host = make_host(name="keep", cpus=8)
    rows = [host_row(i) for i in range(1, 1500)] + [host_row(2000, name="keep", cpus=9), host_row(9999, cpus="x")]
    report = assert_refused(lambda: import_csv(rows), "Row 1501 cpus: must be a positive integer")
    assert report.totals["create"] == 1499 and report.totals["reject"] == 1
    assert Hypervisor.objects.count() == 1 and Hypervisor.objects.get().cpus == 8
    assert not ObjectChange.objects.filter(content_type__model="hypervisor").exclude(object_id=str(host.pk)).exists()


def test_json_and_yaml_accept_lists_for_tags(db):
    records = [
        {"name": "j1", "address": "10.0.0.1", "cpus": 2, "memory_mib": 512, "disk_gib": 5, "tags": ["b", "a", "a"]}
    ]
    assert services.import_hypervisors(json.dumps(records).encode(), "json", actor=TEST).committed
    records[0]["name"] = "y1"
    assert services.import_hypervisors(yaml.safe_dump(records).encode(), "yaml", actor=TEST).committed
    assert sorted(t.name for t in Hypervisor.objects.get(name="y1").tags.all()) == ["a", "b"]
    records[0].update(name="bad", tags={"not": "a list"})
    assert_refused(lambda: services.import_hypervisors(json.dumps(records).encode(), "json", actor=TEST), "Row 1 tags:")


def yaml_alias_bomb(levels):
    """A YAML list of one host whose ``a0`` … ``a<levels-1>`` each hold nine aliases of the one
    before: a few hundred bytes that stand for 9**levels strings."""
    lines = ["- name: h1", '  a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(db):
    data = yaml_alias_bomb(9)  # 387 million strings: minutes of CPU once walked
    assert len(data) < 600
    report = assert_refused(
        lambda: services.import_hypervisors(data, "yaml", actor=TEST), "line 3: the YAML refers to anchor a0 (*a0)"
    )
    assert len(report.messages()) == 1


def test_yaml_anchors_without_aliases_and_the_export_still_import(db, make_host):
    data = b"- &h {name: h1, address: 10.0.0.1, cpus: 2, memory_mib: 512, disk_gib: 5, tags: [a, b]}\n"
    assert services.import_hypervisors(data, "yaml", actor=TEST).committed
    export = services.export_hypervisors("yaml")
    assert b"*" not in export and b"&" not in export


def test_an_import_sets_a_hosts_overlay_and_refuses_one_its_driver_cannot_attach(db, monkeypatch):
    report = import_csv([host_row(1, overlay="vxlan-lab")])
    assert report.committed, report.messages()
    assert Hypervisor.objects.get(name="h00001").overlay == "vxlan-lab"
    # Every driver here attaches one: the refusal is played without vmware's.
    monkeypatch.setattr("drivers.registry.OVERLAY_DRIVERS", ("sim", "libvirt"))
    report = import_csv([host_row(2, driver="vmware", uri="https://vc.example.org/sdk", overlay="vxlan-lab")])
    assert not report.committed
    assert any("cannot attach private networks to an overlay" in m for m in report.messages()), report.messages()
