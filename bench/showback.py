"""Showback on a year of stored history: the usage report per user, class, group and image.

    python bench/showback.py [--students 5000] [--days 365] [--per-week 2.5] [--postgres URL] [--smoke]

Makes ``--students`` students in courses of 100 (two classes each), then a year of stored
per-day figures (``UsageRollup``, one row per student and day used, about ``--per-week`` days
a week: class seats, reservations, some batch runs and ad-hoc VMs, a few with GPUs) with bulk
INSERTs (``core.bulk.insert_rows``), every day marked stored, and their month rows rolled
up (``showback.roll_months``, as storing days keeps them). Times, on the whole year: the
report grouped each way as an administrator sees it (everything), an instructor's per-student
report of one class, a student's own, and the API and CSV through Django's test client.
Today is computed live from the (empty) history, as in production. Target: each under 1 s.
"""

import argparse
import random
import time
from datetime import timedelta

from _common import timed  # bench/ is the script's own folder, first on sys.path
from _django import configure

TARGET = 1.0
COURSE = 100  # students per course


def make_people(students):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from accounts import access
    from classes.models import Class
    from provisioning.models import Image

    users = get_user_model().objects
    users.bulk_create([get_user_model()(username=f"s{i:05d}") for i in range(students)], batch_size=2000)
    ids = list(users.order_by("pk").values_list("pk", flat=True))
    image = Image.objects.order_by("pk").first()
    courses, classes = [], []
    for c in range(0, students, COURSE):
        course = Group.objects.create(name=f"course-{c // COURSE:03d}")
        course.user_set.add(*ids[c : c + COURSE])
        courses.append(course)
        for n in range(2):
            today = time.gmtime()
            first = f"{today.tm_year - 1}-01-01"
            classes.append(
                Class.objects.create(
                    name=f"{course.name}-{n}",
                    course=course,
                    image=image,
                    time_zone="UTC",
                    first_day=first,
                    last_day=first,
                )  # fmt: skip
            )
    teacher = users.create_user("bench-teacher")
    courses[0].user_set.add(teacher)
    access.set_roles(teacher, ["instructor"], actor=teacher)
    return ids, courses, classes, teacher


def make_history(ids, courses, classes, days, per_week, seed=1):
    """Stored rows for ``days`` days before today, bulk-inserted; returns the number of rows."""
    from django.contrib.auth.models import Group
    from django.db import transaction
    from django.utils import timezone

    from core.bulk import insert_rows
    from provisioning.models import Image
    from reservations import showback
    from reservations.models import UsageRollup

    rng = random.Random(seed)
    images = list(Image.objects.order_by("pk").values_list("name", flat=True))
    group_of = {uid: courses[i // COURSE].name for i, uid in enumerate(ids)}
    class_of = {uid: classes[2 * (i // COURSE) + i % 2] for i, uid in enumerate(ids)}
    favourite = {uid: rng.choice(images) for uid in ids}
    assert Group.objects.count() >= len(courses)
    names = [
        "span", "day", "kind", "user", "username", "image", "group", "class_id", "class_name",
        "seconds", "vcpu_seconds", "mib_seconds", "gpu_seconds", "uses",
    ]  # fmt: skip
    today = timezone.now().date()
    chance = per_week / 7
    made = 0
    with transaction.atomic():
        rows = []
        for back in range(days, 0, -1):
            day = today - timedelta(days=back)
            for i, uid in enumerate(ids):
                if rng.random() >= chance:
                    continue
                seconds = rng.randint(1800, 4 * 3600)
                kind = rng.choices(("class", "reservation", "run", "vm"), (6, 3, 1, 0.3))[0]
                vcpus, mib = rng.choice(((1, 1024), (2, 2048), (4, 8192)))
                gpus = 1 if kind == "vm" and rng.random() < 0.3 else 0
                klass = class_of[uid] if kind == "class" else None
                # A class seat is of the class's image; a student's own use mostly of a favourite.
                if klass is not None:
                    image = images[klass.pk % len(images)]
                else:
                    image = favourite[uid] if rng.random() < 0.8 else rng.choice(images)
                rows.append(
                    (
                        "day", day, kind, uid, f"s{i:05d}", image, group_of[uid],
                        klass.pk if klass else None, klass.name if klass else "",
                        seconds, seconds * vcpus, seconds * mib, seconds * gpus, 1,
                    )
                )  # fmt: skip
            if len(rows) >= 50_000 or back == 1:
                insert_rows(UsageRollup, names, rows)
                made += len(rows)
                rows = []
        showback.store({today - timedelta(days=back): {} for back in range(days, 0, -1)})  # each day's mark
    return made


def roll_months(days):
    """The month rows of the stored year (what ``rollup.aggregate`` keeps up as it stores days)."""
    from django.db import transaction
    from django.utils import timezone

    from reservations import showback

    today = timezone.now().date()
    with transaction.atomic():
        showback.roll_months(today - timedelta(days=days), today - timedelta(days=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=5000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--per-week", type=float, default=2.5, help="days a week a student uses a machine")
    parser.add_argument("--postgres", help="a disposable PostgreSQL database URL (default: a temporary SQLite file)")
    parser.add_argument("--smoke", action="store_true", help="500 students")
    args, _ = parser.parse_known_args(argv)
    if args.smoke:
        args.students = 500
    vendor = configure(args.postgres, "vclmgr-showback-")
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from provisioning import services as vms
    from reservations import showback

    for name in ("debian-12", "ubuntu-24.04", "windows-11", "matlab-r2025", "rstudio"):
        vms.create_image(actor="bench", name=name, os=name)
    t = time.perf_counter()
    ids, courses, classes, teacher = make_people(args.students)
    made = make_history(ids, courses, classes, args.days, args.per_week)
    made_in = time.perf_counter() - t
    rolled, _ = timed(lambda: roll_months(args.days), repeat=1)
    if vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    print(
        f"showback ({vendor}): {args.students} students, {len(classes)} classes, {made} stored rows over "
        f"{args.days} days, made in {made_in:.1f} s; their month rows rolled up in {rolled:.1f} s"
    )
    settings.USAGE_PRICES = {"hour": 0.02, "vcpu_hour": 0.01, "gib_hour": 0.005, "gpu_hour": 0.5}
    today = timezone.now().date()
    first, last = today - timedelta(days=args.days - 1), today
    everyone = showback.Scope(everything=True)
    results = []
    for by in showback.GROUPINGS:
        seconds, report = timed(lambda b=by: showback.report(first, last, by=b, scope=everyone))
        results.append((f"year by {by} (administrator), {len(report['rows'])} rows", seconds))
    from django.contrib.auth import get_user_model

    one_class = classes[0].pk
    scope = showback.visible_usage(teacher)
    seconds, report = timed(
        lambda: showback.report(first, last, by="user", scope=scope, filters={"class_id": one_class})
    )
    results.append((f"year, one class per student (instructor), {len(report['rows'])} rows", seconds))
    student = get_user_model().objects.get(pk=ids[0])
    scope = showback.visible_usage(student)
    seconds, report = timed(lambda: showback.report(first, last, by="image", scope=scope))
    results.append(("year, a student's own by image", seconds))
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    admin = get_user_model().objects.create_user("bench-admin", is_staff=True)
    client = Client()
    client.force_login(admin)
    query = f"?from={first}&to={last}"
    for label, url in (
        ("API /api/v1/usage/showback/?by=user", "/api/v1/usage/showback/" + query + "&by=user"),
        ("API /api/v1/usage/showback/?by=class", "/api/v1/usage/showback/" + query + "&by=class"),
        ("CSV /reservations/showback.csv?by=user", "/reservations/showback.csv" + query + "&by=user"),
    ):
        seconds, response = timed(lambda u=url: client.get(u))
        assert response.status_code == 200, response.content[:300]
        results.append((label, seconds))
    for label, seconds in results:
        print(f"  {label:<62} {seconds * 1000:>9.0f} ms")
    slow = [label for label, s in results if s > TARGET]
    print(f"  target: every report under {TARGET:.0f} s: {'met' if not slow else 'MISSED: ' + ', '.join(slow)}")


if __name__ == "__main__":
    main()
