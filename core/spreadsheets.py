"""Cells written to files people open in a spreadsheet (CSV, XLSX): every export goes through here.

A text cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a formula to
Excel, LibreOffice and Google Sheets (``=HYPERLINK(…)`` in an image's name becomes a link the
reader clicks). ``escape_cell`` writes such a cell with a leading ``'``, as OWASP advises for CSV
injection, and one already starting with quotes before such a character gets one more, so
``unescape_cell`` gives back exactly what was escaped: an export imports back unchanged.
Numbers are left alone (``-2`` stays a number).
"""

import csv
import re

_FORMULA = re.compile(r"^'*[=+\-@\t\r]")
_ESCAPED = re.compile(r"^'+[=+\-@\t\r]")


def escape_cell(value):
    """'=1+1' → "'=1+1" (and "'=x" → "''=x", so it reverses); anything but text as it is."""
    if isinstance(value, str) and _FORMULA.match(value):
        return "'" + value
    return value


def unescape_cell(value):
    if isinstance(value, str) and _ESCAPED.match(value):
        return value[1:]
    return value


def escape_row(row):
    return [escape_cell(cell) for cell in row]


class _EscapingWriter:
    def __init__(self, writer):
        self._writer = writer

    def writerow(self, row):
        return self._writer.writerow(escape_row(row))

    def writerows(self, rows):
        for row in rows:
            self.writerow(row)


def csv_writer(out, **options):
    """``csv.writer(out, **options)`` whose every cell goes through ``escape_cell``."""
    return _EscapingWriter(csv.writer(out, **options))
