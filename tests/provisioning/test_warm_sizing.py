"""The warm pool's size from its usage history (``provisioning.warm_sizing``): pure, no database."""

from datetime import UTC, datetime, timedelta

import pytest

from provisioning import warm_sizing


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 75, 0),
        ([4], 1, 4),
        ([1, 2, 3, 4], 50, 2),
        ([1, 2, 3, 4], 75, 3),
        ([4, 1, 3, 2], 100, 4),
        ([0, 0, 9, 0], 75, 0),  # one busy week is no habit
        ([5, 7, 6, 9], 1, 5),
    ],
)
def test_the_nearest_rank_percentile(values, q, expected):
    assert warm_sizing.percentile(values, q) == expected


def test_it_rejects_a_percentile_out_of_range():
    with pytest.raises(ValueError):
        warm_sizing.percentile([1], 0)
    with pytest.raises(ValueError):
        warm_sizing.percentile([1], 101)


@pytest.mark.parametrize(
    ("past", "low", "high", "expected"),
    [
        ([], 1, 5, 1),  # no history: the minimum
        ([0, 0, 0, 0], 0, 5, 0),
        ([2, 3, 4, 3], 0, 10, 3),
        ([20, 30, 25, 22], 1, 8, 8),  # never above the maximum
        ([0, 1, 0, 0], 2, 8, 2),  # never below the minimum
    ],
)
def test_the_wanted_count_is_the_history_kept_within_the_sizes(past, low, high, expected):
    assert warm_sizing.wanted(past, low, high) == expected


def test_it_rejects_a_minimum_above_the_maximum():
    with pytest.raises(ValueError):
        warm_sizing.wanted([1], 3, 2)


def test_the_windows_are_the_same_hour_of_past_weeks_latest_first():
    now = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)  # a Monday
    windows = warm_sizing.hour_windows(now, 3)
    assert [start.weekday() for start, _ in windows] == [0, 0, 0]
    assert windows[0] == (datetime(2026, 11, 30, 9, 30, tzinfo=UTC), datetime(2026, 11, 30, 10, 30, tzinfo=UTC))
    assert windows[2][0] == now - timedelta(weeks=3)
    assert warm_sizing.hour_windows(now, 0) == []


def test_it_imports_nothing_of_django():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(warm_sizing.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [name for name in names if name.split(".")[0] not in ("datetime", "math")]
