"""Reading and writing tabular files (CSV, XLSX, JSON, YAML) for bulk import and export.

``load()`` turns bytes into a ``tablib.Dataset`` or raises ``FileError`` with a message a
person can act on (empty file, header only, not UTF-8, over the size or row limit, …).
``dump()`` is its inverse. In CSV and XLSX, cells that a spreadsheet would run as formulas
are written escaped (``core.spreadsheets``, as every export); ``load()`` removes exactly that
escape again, so an export imports back unchanged.

``inventory.admin_formats`` adapts both to django-import-export, so the admin's import and
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

from core import yamlsafe
from core.spreadsheets import escape_row, unescape_cell

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
MAX_XLSX_STRING_BYTES = 512  # shared strings' XML per row: each costs ~150 bytes of memory however short
MAX_XLSX_ROW_CELLS = 16384  # Excel's own width; openpyxl holds a row's cells all at once
MAX_XLSX_ROW_XML = 1024 * 1024  # one row's XML, for the same reason
MAX_XLSX_PACKAGE_BYTES = 4 * 1024 * 1024  # a workbook's other parts read (styles…): a few KiB in practice


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
    sheet's own dimensions are not trusted. openpyxl reads a copy of the parts the import
    needs (``_needed_parts``), never the upload itself."""
    import openpyxl

    limit = max_rows()
    copy = _needed_parts(data, limit)
    try:
        book = openpyxl.load_workbook(io.BytesIO(copy), read_only=True, data_only=True, keep_links=False)
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


def _needed_parts(data, limit):
    """A new XLSX of what the import reads of ``data``: the content types, the workbook and its
    relationships, the styles (they say which numbers are dates), the shared strings and the
    first worksheet, given a ``<dimension>`` if it has none.

    A zip can inflate a small upload a thousandfold, in any part. The other parts (themes,
    pictures, document properties, other sheets) are never inflated; the parts read are
    bounded (``_Inflating``) and copied a chunk at a time, so memory holds the copy
    compressed, never a whole part inflated. Without a dimension, openpyxl's read-only mode
    parses the whole sheet just to learn its size, before a single row is read; the one given
    reaches one row past the limit, so reading also stops there."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError):
        raise FileError("the file is not an XLSX workbook") from None
    parts = _Inflating(archive, limit)
    out = io.BytesIO()
    with archive, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as copy:
        try:
            sheet, strings = _find_parts(parts)
            for name, content in parts.whole.items():
                copy.writestr(name, content)
            if strings:
                _copy(parts.chunks(strings, "strings"), copy, strings)
            _copy(_checked_sheet(parts.chunks(sheet, "sheet"), limit), copy, sheet)
        except FileError:
            raise
        except (zipfile.BadZipFile, KeyError, OSError, ValueError, TypeError, SyntaxError, NotImplementedError):
            # SyntaxError: ElementTree's ParseError; NotImplementedError: a compression zipfile lacks
            raise FileError("the file is not an XLSX workbook") from None
    return out.getvalue()


def _find_parts(parts):
    """(the first worksheet's name, the shared strings' name or None), reading the small parts
    that lead to them as openpyxl does (they stay in ``parts.whole``)."""
    from openpyxl.packaging.manifest import Manifest
    from openpyxl.packaging.relationship import get_dependents, get_rels_path
    from openpyxl.packaging.workbook import WorkbookPackage
    from openpyxl.xml.constants import ARC_STYLE, SHARED_STRINGS, XLSM, XLSX, XLTM, XLTX
    from openpyxl.xml.functions import fromstring

    manifest = Manifest.from_tree(fromstring(parts.read("[Content_Types].xml")))
    found = next(filter(None, (manifest.find(kind) for kind in (XLSX, XLSM, XLTX, XLTM))), None)
    workbook = found.PartName[1:] if found else "xl/workbook.xml"
    sheets = WorkbookPackage.from_tree(fromstring(parts.read(workbook))).sheets
    targets = get_dependents(parts, get_rels_path(workbook)).to_dict()
    # openpyxl's first worksheet: the first sheet present that is not a chart sheet
    rels = (targets.get(sheet.id) for sheet in sheets)
    sheet = next((r.target for r in rels if r and "chartsheet" not in r.Type and parts.has(r.target)), None)
    if sheet is None:
        raise FileError("the XLSX workbook has no worksheet")
    if parts.has(ARC_STYLE):
        parts.read(ARC_STYLE)
    found = manifest.find(SHARED_STRINGS)
    strings = found.PartName[1:] if found and parts.has(found.PartName[1:]) else None
    return sheet, strings


class _Inflating:
    """Reads parts of a zip within budgets of inflated bytes: the worksheet's and the shared
    strings' (streamed) grow with the row limit, the small parts read whole (kept in ``whole``)
    share one of their own. A part's declared size is checked before it is opened, and its
    bytes are counted as they inflate, since a declared size can lie."""

    def __init__(self, archive, limit):
        self.archive = archive
        self.budgets = {
            "sheet": (limit + 1) * MAX_XLSX_ROW_BYTES,
            "strings": (limit + 1) * MAX_XLSX_STRING_BYTES,
            "package": MAX_XLSX_PACKAGE_BYTES,
        }
        self.left = dict(self.budgets)
        self.whole = {}

    def has(self, name):
        try:
            self.archive.getinfo(name)
        except KeyError:
            return False
        return True

    def read(self, name):
        if name not in self.whole:
            self.whole[name] = b"".join(self.chunks(name, "package"))
        return self.whole[name]

    def chunks(self, name, budget):
        info = self.archive.getinfo(name)
        if info.file_size > self.left[budget]:
            raise self._over(name, budget)
        with self.archive.open(info) as part:
            while chunk := part.read(64 * 1024):
                self.left[budget] -= len(chunk)
                if self.left[budget] < 0:
                    raise self._over(name, budget)
                yield chunk

    def _over(self, name, budget):
        cells = "more cells than an import may hold; split it into smaller files"
        what, why = {
            "sheet": ("sheet is", cells),
            "strings": ("shared strings are", cells),
            "package": (
                "parts other than its cells are",
                "far more than a workbook needs; copy the sheet into a new workbook",
            ),
        }[budget]
        return FileError(
            f"the workbook's {what} over {self.budgets[budget]:,} bytes of XML uncompressed ({name}): {why}"
        )


def _copy(chunks, archive, name):
    with archive.open(name, "w", force_zip64=True) as target:
        for chunk in chunks:
            target.write(chunk)


_SHEET_DATA = re.compile(rb"<(\w+:)?sheetData[\s>/]")
_TAG_SPLIT = 256  # bytes held back between chunks, so a tag cut in two is still found


def _checked_sheet(chunks, limit):
    """A worksheet's chunks, with a dimension before its data unless one is there already, and
    each row bounded (``_RowCheck``) as it passes."""
    pending, dimension = b"", False
    for chunk in chunks:
        pending += chunk
        if found := _SHEET_DATA.search(pending):
            if not (dimension or b"<dimension" in pending[: found.start()]):
                tag = b'<%sdimension ref="A1:XFD%d"/>' % (found.group(1) or b"", limit + 2)
                pending = pending[: found.start()] + tag + pending[found.start() :]
            rows = _RowCheck(pending, found.start())
            yield pending
            for chunk in chunks:
                rows.feed(chunk)
                yield chunk
            rows.feed(b"", last=True)
            return
        dimension = dimension or b"<dimension" in pending
        yield pending[:-_TAG_SPLIT]
        pending = pending[-_TAG_SPLIT:]
    yield pending


_SHEET_TAG = re.compile(rb"<(/?)(?:\w+:)?(row|c|sheetData)[\s>/]")


class _RowCheck:
    """FileError for a row of over ``MAX_XLSX_ROW_CELLS`` cells or ``MAX_XLSX_ROW_XML`` bytes:
    openpyxl builds a whole row's elements before it yields the row (and reads every cell of it,
    whatever ``max_col``), so one row of millions of empty cells costs gigabytes, though its
    XML is within the sheet's budget. Tags are found in the chunks as they pass, a few bytes
    held back so a tag cut in two is still found (and counted once)."""

    def __init__(self, head, data_at):
        self.buffer, self.buffer_at = head[data_at:], data_at  # from <sheetData>
        self.counted_to = data_at  # tags starting before this offset are counted already
        self.row, self.row_at, self.cells, self.done = 0, None, 0, False

    def feed(self, chunk, last=False):
        if self.done:
            return
        self.buffer += chunk
        end = self.buffer_at + len(self.buffer)
        until = end if last else end - _TAG_SPLIT
        for tag in _SHEET_TAG.finditer(self.buffer):
            at = self.buffer_at + tag.start()
            if at < self.counted_to:
                continue
            if at >= until:
                break
            closing, name = tag.groups()
            if closing and name == b"sheetData":
                self.done = True
                return
            if not closing and name == b"row":
                self.row, self.row_at, self.cells = self.row + 1, at, 0
            elif not closing and name == b"c":
                self.cells += 1
                if self.cells > MAX_XLSX_ROW_CELLS:
                    raise self._too_wide(f"over {MAX_XLSX_ROW_CELLS:,} cells")
        if self.row_at is not None and until - self.row_at > MAX_XLSX_ROW_XML:
            raise self._too_wide(f"over {MAX_XLSX_ROW_XML:,} bytes of XML")
        self.counted_to = until
        self.buffer, self.buffer_at = self.buffer[until - self.buffer_at :], until

    def _too_wide(self, what):
        return FileError(f"row {self.row} of the sheet has {what}, more than an import reads in one row")


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
    text = _decode(data)
    try:
        records = yamlsafe.load(text)
    except yamlsafe.AliasError as exc:
        raise FileError(f"{exc}; an import takes no aliases: write the value out") from None
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
        rows = [escape_row(row) for row in rows]
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


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    def ignore_aliases(self, data):
        return True  # a value written twice is written out twice: the import takes no aliases


def _dump_yaml(headers, rows):
    return yaml.dump(_records(headers, rows), Dumper=_Dumper, sort_keys=False, allow_unicode=True).encode()


_DUMPERS = {"csv": _dump_csv, "xlsx": _dump_xlsx, "json": _dump_json, "yaml": _dump_yaml}
