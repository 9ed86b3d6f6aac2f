"""Ganeti's query filter language (``doc/design-query2.rst``), checked then evaluated over rows.

A filter is a nested list: ``["&", f, …]``, ``["|", f, …]``, ``["!", f]``, ``["?", field]``
(the field's truth), or ``[op, field, value]`` with ``op`` one of ``=`` (``==``), ``!=``,
``=~`` (a regular expression, searched), ``<``, ``>``, ``<=``, ``>=`` and ``=[]`` (the field's
list contains the value). ``compile_filter`` checks the whole filter against the fields' kinds
before any row is read, so a bad filter is refused with its reason and nothing is half-answered;
it returns a predicate over a row (a dict). A row whose field is missing (None) matches no
comparison, as Ganeti's fields without data match nothing.

Pure: no Django, no I/O.
"""

import operator
import re

ORDERING = {"<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}
EQUALITY = {"=": operator.eq, "==": operator.eq, "!=": operator.ne}
#: Ganeti's field kinds (``constants.QFT_*``) that ordering comparisons accept, and the values' types.
ORDERED_KINDS = {"number": (int, float), "unit": (int, float), "timestamp": (int, float), "text": (str,)}
#: A field whose kind is known only per row (a job's opcode parameters): any operator is
#: accepted, and a row whose value is not comparable with the filter's does not match.
ANY = "any"


class FilterError(ValueError):
    """A filter that cannot be evaluated; the message names what is wrong, as Ganeti's
    ``ParameterError`` does."""


def compile_filter(qfilter, kinds):
    """A predicate ``row -> bool`` for ``qfilter`` over fields of ``kinds`` (name -> Ganeti kind);
    ``None`` matches every row."""
    if qfilter is None:
        return lambda row: True
    return _compile(qfilter, kinds, depth=0)


def used_fields(qfilter):
    """The field names a (valid) filter reads."""
    if not isinstance(qfilter, list) or not qfilter:
        return set()
    op, args = qfilter[0], qfilter[1:]
    if op in ("&", "|", "!"):
        return set().union(*(used_fields(arg) for arg in args))
    return {args[0]} if args and isinstance(args[0], str) else set()


MAX_DEPTH = 32


def _compile(node, kinds, depth):
    if depth > MAX_DEPTH:
        raise FilterError(f"Filter nested more than {MAX_DEPTH} levels")
    if not isinstance(node, list) or not node:
        raise FilterError(f"Invalid filter: expected a non-empty list, not {_show(node)}")
    op, args = node[0], node[1:]
    if op in ("&", "|"):
        parts = [_compile(arg, kinds, depth + 1) for arg in args]
        combine = all if op == "&" else any
        return lambda row: combine(part(row) for part in parts)
    if op == "!":
        _arity(op, args, 1)
        inner = _compile(args[0], kinds, depth + 1)
        return lambda row: not inner(row)
    if op == "?":
        _arity(op, args, 1)
        field = _field(args[0], kinds)
        return lambda row: bool(row.get(field))
    if op in EQUALITY or op in ORDERING or op in ("=~", "=[]"):
        _arity(op, args, 2)
        return _comparison(op, _field(args[0], kinds), kinds[args[0]], args[1])
    raise FilterError(f"Unknown operator {_show(op)}")


def _comparison(op, field, kind, value):
    if isinstance(value, (list, dict)):
        raise FilterError(f"Operator '{op}' on field '{field}': the value must be a string, number or boolean")
    if op == "=~":
        if kind not in ("text", ANY) or not isinstance(value, str):
            raise FilterError(f"Operator '=~' needs a text field and a regular expression (field '{field}')")
        try:
            pattern = re.compile(value)
        except re.error as exc:
            raise FilterError(f"Invalid regular expression {value!r}: {exc}") from None
        return lambda row: isinstance(row.get(field), str) and pattern.search(row[field]) is not None
    if op == "=[]":
        if kind not in ("other", ANY):
            raise FilterError(f"Operator '=[]' needs a list field, and '{field}' is {kind}")
        return lambda row: isinstance(row.get(field), list) and value in row[field]
    if op in ORDERING:
        types = (int, float, str) if kind == ANY else ORDERED_KINDS.get(kind)
        if types is None or isinstance(value, bool) or not isinstance(value, types):
            raise FilterError(f"Operator '{op}' cannot compare field '{field}' ({kind}) with {_show(value)}")
        compare, family = ORDERING[op], (str,) if isinstance(value, str) else (int, float)
        return lambda row: _comparable(row.get(field), family) and compare(row[field], value)
    compare = EQUALITY[op]
    return lambda row: row.get(field) is not None and compare(row[field], value)


def _comparable(current, family):
    return current is not None and not isinstance(current, bool) and isinstance(current, family)


def _arity(op, args, count):
    if len(args) != count:
        raise FilterError(f"Operator '{op}' takes {count} argument(s), not {len(args)}")


def _field(name, kinds):
    if not isinstance(name, str):
        raise FilterError(f"A field name must be a string, not {_show(name)}")
    if name not in kinds:
        raise FilterError(f"Unknown field '{name}'")
    return name


def _show(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
