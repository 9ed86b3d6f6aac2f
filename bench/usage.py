"""Usage reports on a year of history: report time with and without the per-day pre-aggregation.

    python bench/usage.py [--reservations 100000] [--days 365] [--postgres URL] [--smoke]

Makes ``--reservations`` ended reservations (with their ready / ended history) spread over
``--days`` days (``reservations.demo.usage_history``), then times, on the whole year and on the
last 30 days: the report computed live from the history (``stored=False``), the backfill
(``usage_backfill``), the report from the stored days (today live), and the staff API and page
through Django's test client. Target: the stored year report and its API under 1 s.
"""

import argparse
import time
from datetime import timedelta

from _common import timed  # bench/ is the script's own folder, first on sys.path
from _django import configure

TARGET = 1.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reservations", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--postgres", help="a disposable PostgreSQL database URL (default: a temporary SQLite file)")
    parser.add_argument("--smoke", action="store_true", help="10,000 reservations")
    args, _ = parser.parse_known_args(argv)
    if args.smoke:
        args.reservations = 10_000
    vendor = configure(args.postgres, "vclmgr-usage-")
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone

    from provisioning import services as vms
    from reservations import demo, rollup, usage

    for name in ("debian-12", "ubuntu-24.04", "windows-11", "matlab-r2025", "rstudio"):
        vms.create_image(actor="bench", name=name, os=name)
    t = time.perf_counter()
    made = demo.usage_history(args.days, max(1, args.reservations // args.days))
    print(
        f"usage report ({vendor}): {made} reservations over {args.days} days, made in {time.perf_counter() - t:.1f} s"
    )
    today = timezone.now().date()
    year, month = (today - timedelta(days=args.days - 1), today), (today - timedelta(days=29), today)
    rows = []
    for label, (first, last) in (("year", year), ("30 days", month)):
        live, expected = timed(lambda f=first, la=last: usage.report(f, la, stored=False), repeat=1)
        rows.append((f"report, {label}, live from the history", live))
        if label == "year":
            backfill, _ = timed(lambda: rollup.backfill(year[0], year[1]), repeat=1)
            rows.append(("backfill of the year (once)", backfill))
        stored, got = timed(lambda f=first, la=last: usage.report(f, la))
        assert got == expected, "stored and live reports differ"
        rows.append((f"report, {label}, stored days + today live", stored))
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    admin = get_user_model().objects.create_user("bench-admin", is_staff=True)
    client = Client()
    client.force_login(admin)
    query = f"?from={year[0]}&to={year[1]}"
    for label, url in (
        ("API /api/v1/usage/, year", "/api/v1/usage/"),
        ("page /reservations/usage/, year", "/reservations/usage/"),
    ):
        seconds, response = timed(lambda u=url: client.get(u + query))
        assert response.status_code == 200, response.content[:300]
        rows.append((label + " (stored)", seconds))
    for label, seconds in rows:
        print(f"  {label:<48} {seconds * 1000:>9.0f} ms")
    slow = [label for label, s in rows if "stored" in label and s > TARGET]
    print(f"  target: stored reports under {TARGET:.0f} s: {'met' if not slow else 'MISSED: ' + ', '.join(slow)}")


if __name__ == "__main__":
    main()
