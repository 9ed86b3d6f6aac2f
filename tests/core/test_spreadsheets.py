"""The one escape every spreadsheet export uses (CSV and XLSX): formulas written as text."""

import csv
import io

import pytest

from core import spreadsheets

# OWASP's CSV injection list: each a formula (or a way into one) to Excel, LibreOffice or Sheets.
FORMULAS = ['=HYPERLINK("http://evil.example/","x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1", "\r=1"]


@pytest.mark.parametrize("value", FORMULAS)
def test_a_formula_is_written_with_a_leading_quote(value):
    assert spreadsheets.escape_cell(value) == "'" + value


def test_other_values_are_left_alone():
    for value in ["plain", "a=b", " =x", "", None, -2, 1.5, "'quoted"]:
        assert spreadsheets.escape_cell(value) == value


def test_escaping_is_reversible():
    for value in ["=x", "'=x", "''=x", "'x", "x", "-", "@", "\tx", "plain 'quote'"]:
        assert spreadsheets.unescape_cell(spreadsheets.escape_cell(value)) == value


def test_the_csv_writer_escapes_every_cell():
    out = io.StringIO()
    spreadsheets.csv_writer(out).writerows([FORMULAS, ["ok", 1]])
    rows = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    assert rows == [["'" + value for value in FORMULAS], ["ok", "1"]]
