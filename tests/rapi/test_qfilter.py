"""Ganeti's query filter language, in process and without Django."""

import pytest

from rapi.qfilter import FilterError, compile_filter, used_fields

KINDS = {"name": "text", "oper_ram": "number", "oper_state": "bool", "tags": "other", "pnode": "text"}
ROWS = [
    {"name": "web1", "oper_ram": 1024, "oper_state": True, "tags": ["web", "prod"], "pnode": "node1"},
    {"name": "web2", "oper_ram": 512, "oper_state": False, "tags": ["web"], "pnode": "node2"},
    {"name": "db1", "oper_ram": None, "oper_state": False, "tags": [], "pnode": "node1"},
]


def names(qfilter):
    match = compile_filter(qfilter, KINDS)
    return [row["name"] for row in ROWS if match(row)]


@pytest.mark.parametrize(
    ("qfilter", "expected"),
    [
        (None, ["web1", "web2", "db1"]),
        (["=", "name", "web1"], ["web1"]),
        (["==", "name", "web1"], ["web1"]),
        (["!=", "pnode", "node1"], ["web2"]),
        (["=~", "name", "^web"], ["web1", "web2"]),
        (["<", "oper_ram", 1024], ["web2"]),
        ([">", "oper_ram", 512], ["web1"]),
        (["<=", "oper_ram", 1024], ["web1", "web2"]),
        ([">=", "oper_ram", 1024], ["web1"]),
        (["?", "oper_state"], ["web1"]),
        (["=[]", "tags", "web"], ["web1", "web2"]),
        (["&", ["=", "pnode", "node1"], ["!", ["?", "oper_state"]]], ["db1"]),
        (["|", ["=", "name", "db1"], ["=[]", "tags", "prod"]], ["web1", "db1"]),
        (["&"], ["web1", "web2", "db1"]),
        (["|"], []),
    ],
)
def test_it_selects_the_rows_ganeti_would(qfilter, expected):
    assert names(qfilter) == expected


def test_a_row_without_data_matches_no_comparison():
    assert names(["!=", "oper_ram", 1]) == ["web1", "web2"]
    assert names(["!", [">", "oper_ram", 0]]) == ["db1"]


@pytest.mark.parametrize(
    ("qfilter", "reason"),
    [
        ("name", "expected a non-empty list"),
        ([], "expected a non-empty list"),
        (["~~", "name", "x"], "Unknown operator '~~'"),
        (["=", "colour", "red"], "Unknown field 'colour'"),
        (["=", "name"], "takes 2 argument(s), not 1"),
        (["!", ["?", "name"], ["?", "name"]], "takes 1 argument(s), not 2"),
        (["=~", "name", "("], "Invalid regular expression"),
        (["=~", "oper_ram", "1"], "needs a text field"),
        (["<", "oper_ram", "big"], "cannot compare field 'oper_ram'"),
        (["<", "oper_state", 1], "cannot compare field 'oper_state'"),
        (["<", "oper_ram", True], "cannot compare"),
        (["=[]", "name", "w"], "needs a list field"),
        (["=", "name", ["web1"]], "must be a string, number or boolean"),
        (["=", 3, "x"], "A field name must be a string"),
        (["&", ["=", "name", "web1"], ["?", "nowhere"]], "Unknown field 'nowhere'"),
    ],
)
def test_it_rejects_a_bad_filter_with_its_reason(qfilter, reason):
    with pytest.raises(FilterError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        compile_filter(qfilter, KINDS)


def test_it_rejects_a_filter_nested_too_deep():
    deep = ["?", "name"]
    for _ in range(40):
        deep = ["!", deep]
    with pytest.raises(FilterError, match="nested more than"):
        compile_filter(deep, KINDS)


def test_it_names_the_fields_a_filter_reads():
    assert used_fields(["&", ["=", "name", "a"], ["!", ["?", "tags"]], ["|", ["<", "oper_ram", 1]]]) == {
        "name",
        "tags",
        "oper_ram",
    }


def test_a_field_of_any_kind_takes_every_operator_and_skips_rows_it_cannot_compare():
    kinds = {"size": "any"}
    rows = [{"size": 10}, {"size": "big"}, {"size": None}, {"size": True}]
    assert [compile_filter([">", "size", 5], kinds)(row) for row in rows] == [True, False, False, False]
    assert [compile_filter(["=~", "size", "^b"], kinds)(row) for row in rows] == [False, True, False, False]
