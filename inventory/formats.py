"""Reading and writing tabular files (CSV, XLSX, JSON, YAML) for bulk import and export.

``load()`` turns bytes into a ``tablib.Dataset`` or raises ``FileError`` with a message a
person can act on (empty file, header only, not UTF-8, over the size or row limit, …).
``dump()`` is its inverse. In CSV and XLSX, text cells starting with ``= + - @`` (or a tab
or carriage return) are written with a leading ``'`` so spreadsheets do not run them as
formulas; ``load()`` removes exactly that quote again, so an export imports back unchanged.

The ``*Format`` classes adapt both to django-import-export, so the admin's import and
export read and write files exactly as the API and the CLI do.
"""

import csv
import io
import json
import re
import zipfile

import tablib
import yaml
from django.conf import settings
from import_export.formats.base_formats import Format

FORMATS = ("csv", "xlsx", "json", "yaml")
EXTENSIONS = {".csv": "csv", ".xlsx": "xlsx", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}
CONTENT_TYPES = {
    "csv": "text/csv",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "json": "application/json",
    "yaml": "application/yaml",
}
SPREADSHEETS = {"csv", "xlsx"}
MAX_XLSX_COLUMNS = 200  # the export has about 25; a sheet's width multiplies the cells read
MAX_XLSX_ROW_BYTES = 4096  # XML per row allowed on average; an exported row takes about 1 KiB

_FORMULA = re.compile(r"^'*[=+\-@\t\r]")
_ESCAPED = re.compile(r"^'+[=+\-@\t\r]")


class FileError(ValueError):
    """The file as a whole cannot be imported; the message says why."""


def max_bytes():
    return settings.INVENTORY_IMPORT_MAX_BYTES


def max_rows():
    return settings.INVENTORY_IMPORT_MAX_ROWS


def check_size(size):
    """FileError when a file of ``size`` bytes is over the configured limit."""
    limit = max_bytes()
    if size > limit:
        raise FileError(
            f"the file is {size:,} bytes, over the limit of {limit:,} bytes "
            "(INVENTORY_IMPORT_MAX_BYTES): split it into smaller files"
        )


def guess_format(filename):
    lowered = (filename or "").lower()
    for extension, name in EXTENSIONS.items():
        if lowered.endswith(extension):
            return name
    return None


def escape_cell(value):
    """Neutralise a spreadsheet formula: '=1+1' → "'=1+1" (and "'=x" → "''=x", so it reverses)."""
    if isinstance(value, str) and _FORMULA.match(value):
        return "'" + value
    return value


def unescape_cell(value):
    if isinstance(value, str) and _ESCAPED.match(value):
        return value[1:]
    return value


# --- loading --------------------------------------------------------------------------


def load(data, fmt):
    """Bytes of a file in ``fmt`` → a Dataset with at least one row, or FileError."""
    if fmt not in FORMATS:
        raise FileError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    check_size(len(data))
    if not data.strip():
        raise FileError("the file is empty")
    headers, rows = _LOADERS[fmt](data)
    if not rows:
        raise FileError("the file has a header but no rows" if any(headers) else "the file has no rows")
    headers = _clean_headers(headers)
    _refuse_nul(headers, rows)
    if fmt in SPREADSHEETS:
        rows = [[unescape_cell(cell) for cell in row] for row in rows]
    dataset = tablib.Dataset(headers=headers)
    dataset.extend(rows)
    return dataset


def _refuse_nul(headers, rows):
    """No database stores a NUL character in text the same way (PostgreSQL refuses it): say where."""
    for number, row in enumerate(rows, 1):
        for header, cell in zip(headers, row, strict=False):
            if _has_nul(cell):
                raise FileError(f"row {number} {header}: contains a NUL character (\\0); remove it")


def _has_nul(value):
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return any(_has_nul(v) for v in value)
    return False


def _too_many_rows(blank_too=False):
    limit = max_rows()
    counted = " (blank rows count too)" if blank_too else ""
    return FileError(
        f"the file has more than {limit:,} rows{counted}, the limit for one import "
        "(INVENTORY_IMPORT_MAX_ROWS): split it into smaller files"
    )


def _decode(data):
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
        raise FileError(
            f"the file is not UTF-8 text (byte 0x{bad:02x} at position {exc.start}); save it as UTF-8"
        ) from None


def _clean_headers(headers):
    cleaned = [str(h).strip() if h is not None else "" for h in headers]
    if not any(cleaned):
        raise FileError("the first row must name the columns (name, address, driver, …)")
    seen = set()
    for index, header in enumerate(cleaned, 1):
        if not header:
            raise FileError(f"column {index} has no name in the header row")
        if header in seen:
            raise FileError(f"column {header!r} appears twice in the header row")
        seen.add(header)
    return cleaned


def _fit(row, width, number):
    """Pad a short row; refuse a long one unless the extra cells are empty."""
    if len(row) < width:
        return list(row) + [None] * (width - len(row))
    if len(row) > width:
        if any(cell not in (None, "") for cell in row[width:]):
            raise FileError(f"row {number} has {len(row)} cells but the header names {width} columns")
        return list(row[:width])
    return list(row)


def _blank(row):
    return all(cell is None or (isinstance(cell, str) and not cell.strip()) for cell in row)


def _load_csv(data):
    text = _decode(data)
    if "\x00" in text:
        raise FileError("the file contains NUL bytes: it is not a CSV text file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        headers = next(reader, [])
        rows, limit = [], max_rows()
        for record in reader:
            if _blank(record):
                continue
            if len(rows) >= limit:
                raise _too_many_rows()
            rows.append(_fit(record, len(headers), len(rows) + 1))
    except csv.Error as exc:
        raise FileError(f"cannot read the CSV at line {reader.line_num}: {exc}") from None
    return headers, rows


def _load_xlsx(data):
    """Read-only and bounded: a few compressed megabytes can hold millions of (blank) rows or
    cells, so blank rows count toward the row limit, reading stops one row past it, and a row
    is read only one cell past the header's width (enough to refuse a ragged row) — the
    sheet's own dimensions are not trusted."""
    import openpyxl

    limit = max_rows()
    data = _with_dimensions(data, limit)
    try:
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, TypeError):
        raise FileError("the file is not an XLSX workbook") from None
    try:
        sheet = book.worksheets[0]
        headers = list(next(sheet.iter_rows(max_row=1, max_col=MAX_XLSX_COLUMNS + 1, values_only=True), ()))
        while headers and headers[-1] in (None, ""):
            headers.pop()
        if len(headers) > MAX_XLSX_COLUMNS:
            raise FileError(f"the header row has more than {MAX_XLSX_COLUMNS} columns")
        rows = []
        records = sheet.iter_rows(min_row=2, max_row=limit + 2, max_col=max(len(headers), 1) + 1, values_only=True)
        for scanned, record in enumerate(records):
            if scanned >= limit:
                raise _too_many_rows(blank_too=True)
            if not _blank(record):
                rows.append(_fit([_xlsx_value(v) for v in record], len(headers), len(rows) + 1))
    except FileError:
        raise
    except Exception:  # openpyxl raises many types for a damaged sheet
        raise FileError("the XLSX workbook is damaged or unreadable") from None
    finally:
        book.close()
    return headers, rows


_SHEET_DATA = re.compile(rb"<(\w+:)?sheetData[\s>/]")


def _with_dimensions(data, limit):
    """The workbook with a ``<dimension>`` in every worksheet that has none.

    Without one, openpyxl's read-only mode parses the whole sheet just to learn its size, before
    a single row is read (seconds of CPU per compressed megabyte of blank rows). The dimension
    given reaches one row past the limit, so reading also stops there. The sheets' XML is first
    bounded in size: a zip can inflate a small upload a thousandfold."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        sheets = [i for i in archive.infolist() if re.fullmatch(r"xl/worksheets/[^/]+\.xml", i.filename)]
    except (zipfile.BadZipFile, OSError, ValueError):
        return data  # openpyxl says what is wrong with it
    budget = (limit + 1) * MAX_XLSX_ROW_BYTES
    if sum(info.file_size for info in sheets) > budget:
        raise FileError(
            f"the workbook's sheets are over {budget:,} bytes of XML uncompressed: "
            "more cells than an import may hold; split it into smaller files"
        )
    missing = [info for info in sheets if b"<dimension" not in _opening(archive, info)]
    if not missing:
        return data
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as copy:
        for info in archive.infolist():
            content = archive.read(info)
            if info in missing and (found := _SHEET_DATA.search(content)):
                tag = b'<%sdimension ref="A1:XFD%d"/>' % (found.group(1) or b"", limit + 2)
                content = content[: found.start()] + tag + content[found.start() :]
            copy.writestr(info.filename, content)
    return out.getvalue()


def _opening(archive, info):
    """The sheet's XML up to its data (where a dimension, if any, is)."""
    with archive.open(info) as sheet:
        head = sheet.read(64 * 1024)
    return head.split(b"sheetData", 1)[0]


def _xlsx_value(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if value is None or isinstance(value, (int, float, str)):
        return value
    return str(value)


def _load_records(records, what):
    if not isinstance(records, list):
        raise FileError(f"the {what} must be a list of objects, one per hypervisor")
    if len(records) > max_rows():
        raise _too_many_rows()
    headers = {}
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise FileError(f"item {number} of the {what} list is not an object")
        headers.update(dict.fromkeys(str(k) for k in record))
    headers = list(headers)
    rows = [[_record_value(record.get(h)) for h in headers] for record in records]
    return headers, rows


def _record_value(value):
    if isinstance(value, (dict, list, tuple, set)) or value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # YAML dates and the like


def _load_json(data):
    try:
        records = json.loads(_decode(data))
    except json.JSONDecodeError as exc:
        raise FileError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return _load_records(records, "JSON")


def _load_yaml(data):
    # A cheap count first: parsing a huge YAML file takes long, refusing it does not.
    if len(re.findall(rb"^- ", data, re.MULTILINE)) > max_rows():
        raise _too_many_rows()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        records = yaml.load(_decode(data), Loader=loader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise FileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return _load_records(records, "YAML")


_LOADERS = {"csv": _load_csv, "xlsx": _load_xlsx, "json": _load_json, "yaml": _load_yaml}


# --- writing --------------------------------------------------------------------------


def dump(dataset, fmt):
    """A Dataset → bytes of a file in ``fmt``."""
    headers = list(dataset.headers or [])
    rows = [list(row) for row in dataset]
    if fmt in SPREADSHEETS:
        rows = [[escape_cell(cell) for cell in row] for row in rows]
    return _DUMPERS[fmt](headers, rows)


def _dump_csv(headers, rows):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows([["" if cell is None else cell for cell in row] for row in rows])
    return out.getvalue().encode()


def _dump_xlsx(headers, rows):
    import openpyxl

    book = openpyxl.Workbook(write_only=True)
    sheet = book.create_sheet("hypervisors")
    sheet.append(headers)
    for row in rows:
        sheet.append(row)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _records(headers, rows):
    return [dict(zip(headers, row, strict=True)) for row in rows]


def _dump_json(headers, rows):
    return (json.dumps(_records(headers, rows), indent=1, ensure_ascii=False) + "\n").encode()


def _dump_yaml(headers, rows):
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(_records(headers, rows), Dumper=dumper, sort_keys=False, allow_unicode=True).encode()


_DUMPERS = {"csv": _dump_csv, "xlsx": _dump_xlsx, "json": _dump_json, "yaml": _dump_yaml}


# --- django-import-export adapters ----------------------------------------------------


class _InventoryFormat(Format):
    """Always reads bytes, so our loader (not the admin) decides about encodings."""

    name = None

    def __init__(self, encoding=None):
        self.encoding = encoding

    def get_title(self):
        return self.name

    def create_dataset(self, in_stream, **kwargs):
        data = in_stream.encode() if isinstance(in_stream, str) else in_stream
        return load(data, self.name)

    def export_data(self, dataset, **kwargs):
        return dump(dataset, self.name)

    def is_binary(self):
        return True

    def get_read_mode(self):
        return "rb"

    def get_extension(self):
        return self.name

    def get_content_type(self):
        return CONTENT_TYPES[self.name]

    def can_import(self):
        return True

    def can_export(self):
        return True


class CSVFormat(_InventoryFormat):
    name = "csv"


class XLSXFormat(_InventoryFormat):
    name = "xlsx"


class JSONFormat(_InventoryFormat):
    name = "json"


class YAMLFormat(_InventoryFormat):
    name = "yaml"


ADMIN_FORMATS = [CSVFormat, XLSXFormat, JSONFormat, YAMLFormat]
