"""Job verbs: submit, cancel, retry, archive, tune the queue. Web, API, CLI and jobs call these.

Each verb validates everything first (``serializers.ValidationError`` with per-field
messages; nothing is written when anything is wrong), writes in one transaction, records
the change log, emits events, and wakes workers after the commit. State conflicts (cancel
a finished job, retry a successful one) raise ``Conflict``. Who may call a verb is the
caller's business (``registry.may_submit``, ``visible_to``): services act for whoever asks.
"""

import re
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from rest_framework import serializers

from accounts import access
from core import changelog, events
from core.changelog import Actor
from core.errors import Conflict
from core.models import ObjectChange
from jobs import dispatcher, locks, reasons, registry, transitions, wake
from jobs.models import Job, JobDependency, JobLog, QueueSettings

S = Job.Status
MAX_BATCH = 1000
MAX_DEPENDS = 100
MAX_CYCLE_SEARCH = 10000
MAX_ID = 2**63 - 1


def visible_to(user):
    """Jobs a user may see: all for auditors and administrators; an operator's own and the
    cluster's (opcodes that need ``operate``); their own otherwise."""
    if access.can(user, "see_all"):
        return Job.objects.all()
    if access.can(user, "operate"):
        return Job.objects.filter(Q(submitter=user) | Q(opcode__in=registry.operator_opcodes()))
    return Job.objects.filter(submitter=user)


def log_visible_to(user, job):
    """The job's log lines this user may read: debug lines (tracebacks) are for staff only;
    users read the one-line reason in the job's error."""
    entries = job.log_entries.all()
    return entries if access.can(user, "see_cluster") else entries.exclude(level__in=JobLog.STAFF_ONLY_LEVELS)


def may_act_on(user, job):
    if access.is_admin(user) or (job.submitter_id is not None and job.submitter_id == user.pk):
        return True
    return access.can(user, "operate") and job.opcode in registry.operator_opcodes()


def _check_may_cancel(user, job):
    # Jobs the system runs for a user (reservation.settle after a build) carry the user as
    # submitter but an opcode only staff may submit: canceling one would strand what it settles.
    if user is not None and not access.is_admin(user) and not registry.may_submit(user, job.opcode):
        raise Conflict(f"job {job.pk} ({job.opcode}) is run by the system; only staff may cancel it")


# --- submit ---------------------------------------------------------------------------
def submit(
    opcode,
    params=None,
    *,
    actor,
    submitter=None,
    reason=None,
    source=None,
    priority=0,
    depends=(),
    parent=None,
    child_key="",
    trail=None,
    retry_of=None,
    capped=False,
    savepoint=True,
):
    """Queue one job; returns it. See ``submit_batch`` for the arguments."""
    spec = {"opcode": opcode, "params": params, "reason": reason, "priority": priority, "depends": list(depends)}
    try:
        return submit_batch(
            [spec],
            actor=actor,
            submitter=submitter,
            source=source,
            parent=parent,
            child_key=child_key,
            trail=trail,
            retry_of=retry_of,
            capped=capped,
            savepoint=savepoint,
        )[0]
    except serializers.ValidationError as exc:
        detail = exc.detail
        if isinstance(detail, dict) and "jobs" in detail and isinstance(detail["jobs"], dict):
            raise serializers.ValidationError(detail["jobs"].get(0, detail["jobs"])) from None
        raise


def submit_batch(
    specs,
    *,
    actor,
    submitter=None,
    source=None,
    parent=None,
    child_key="",
    trail=None,
    retry_of=None,
    capped=False,
    savepoint=True,
):
    """Queue several jobs at once, all or none.

    Each spec: ``opcode``, ``params`` (dict), ``reason`` (a string or a list of them),
    ``priority`` (-20…20), ``depends`` (``[job_id | [job_id, [statuses]] | "@name" | ["@name", […]]]``;
    ``"@name"`` refers to the spec with that ``name`` in this batch), ``name``. A dependency
    with no statuses accepts ``success`` only; ``[id, []]`` accepts any final status.
    ``trail`` entries go before the specs' reasons; ``parent`` makes them child jobs.
    ``capped``: a user's own request (web, API): refused when their queued and waiting jobs
    would exceed ``VCLMGR_JOBS_MAX_PENDING_PER_USER`` (staff are not capped).
    A dependency may also be a ``Job`` row the caller holds (from code, e.g. one it submitted in
    its transaction): its status is taken from the row, not read again. ``savepoint`` False:
    inside a caller's transaction that is all or nothing anyway (no savepoint of its own).
    """
    actor = Actor.of(actor)
    if submitter is None:
        submitter = actor.user
    if not isinstance(specs, list) or not specs:
        raise serializers.ValidationError({"jobs": ["give at least one job"]})
    if len(specs) > MAX_BATCH:
        raise serializers.ValidationError({"jobs": [f"at most {MAX_BATCH} jobs at once"]})
    base_trail = list(parent.reason) if parent is not None else []
    base_trail += list(trail or [])
    cleaned, errors = [], {}
    for index, spec in enumerate(specs):
        try:
            cleaned.append(_clean_spec(spec, source or "vclmgr"))
        except serializers.ValidationError as exc:
            errors[index] = exc.detail
    if errors:
        raise serializers.ValidationError({"jobs": errors})
    if child_key and len(cleaned) != 1:
        raise serializers.ValidationError({"jobs": ["a child key names one job"]})
    order, names = _batch_order(cleaned)
    _check_cycles(cleaned, parent)
    with transaction.atomic(savepoint=savepoint), transitions.batched():
        if capped:
            _check_backlog(submitter, len(cleaned))
        created = {}
        for index in order:
            specs_depends = cleaned[index]["depends"]
            rows = [(created[names[t[1:]]] if isinstance(t, str) else t, statuses) for t, statuses in specs_depends]
            known = {row.pk: row.status for row, _ in rows if isinstance(row, Job)}
            depends = [(row.pk if isinstance(row, Job) else row, statuses) for row, statuses in rows]
            created[index] = _create(
                cleaned[index], depends, actor, submitter, base_trail, parent, child_key, retry_of, known
            )
        # A job waiting for its dependencies needs no token now: the end of the last of them
        # claims it in the same transaction, or wakes a worker (``tasks.run_next``, ``cancel``).
        startable = sum(1 for job in created.values() if job.status == S.QUEUED)
        if startable:
            wake.after_commit(startable)
    return [created[i] for i in range(len(cleaned))]


def _check_backlog(user, adding):
    """Refuse a user's jobs past their cap, counted under a lock on the user so that parallel
    submissions are counted one after the other (on SQLite the write transaction serialises)."""
    if user is None or access.can(user, "operate"):
        return
    cap = settings.VCLMGR_JOBS_MAX_PENDING_PER_USER
    list(get_user_model().objects.select_for_update(no_key=True).filter(pk=user.pk).values_list("pk"))
    pending = Job.objects.filter(submitter=user, status__in=Job.PENDING).count()
    if pending + adding > cap:
        raise serializers.ValidationError(
            {"jobs": [f"you have {pending} queued or waiting jobs; at most {cap} at once (adding {adding})"]}
        )


def _clean_spec(spec, source):
    if not isinstance(spec, dict):
        raise serializers.ValidationError({"non_field_errors": ["each job must be an object"]})
    unknown = sorted(set(spec) - {"opcode", "params", "reason", "priority", "depends", "name"})
    if unknown:
        raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
    try:
        op = registry.get(spec.get("opcode"))
    except LookupError as exc:
        raise serializers.ValidationError({"opcode": [str(exc)]}) from None
    errors = {}  # field -> messages, filled by each check
    params, lock_list = _clean_params(op, spec.get("params"), errors)
    reason_entries = _clean_reasons(spec.get("reason"), source, errors)
    priority = _clean_priority(spec.get("priority", 0), errors)
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not name or len(name) > 100):
        errors["name"] = ["a non-empty string of at most 100 characters"]
    try:
        depends = _clean_depends(spec.get("depends") or [])
    except serializers.ValidationError as exc:
        errors["depends"] = exc.detail
        depends = []
    if errors:
        raise serializers.ValidationError(errors)
    return {
        "op": op,
        "params": params,
        "locks": lock_list,
        "reasons": reason_entries,
        "priority": priority,
        "depends": depends,
        "name": name,
    }


def _clean_params(op, raw, errors):
    """→ (params, normalized locks); (None, []) with ``errors["params"]`` set when invalid."""
    try:
        params = registry.clean_params(op, raw)
    except serializers.ValidationError as exc:
        detail = exc.detail
        errors["params"] = detail.get("params", detail) if isinstance(detail, dict) else detail
        return None, []
    try:
        return params, locks.normalize(op.lock_list(params))
    except locks.BadLock as exc:
        errors["params"] = [str(exc)]
        return params, []


def _clean_reasons(raw, source, errors):
    """→ reason-trail entries of a string or a list of at most 20 strings."""
    raw = raw or []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or len(raw) > 20:
        errors["reason"] = ["a string, or a list of at most 20 strings"]
        return []
    entries = []
    for text in raw:
        try:
            entries.append(reasons.entry(source, reasons.check(text)))
        except reasons.BadReason as exc:
            errors["reason"] = [str(exc)]
            break
    return entries


def _clean_priority(priority, errors):
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        errors["priority"] = ["must be a whole number"]
    elif not Job.MIN_PRIORITY <= priority <= Job.MAX_PRIORITY:
        errors["priority"] = [f"must be between {Job.MIN_PRIORITY} and {Job.MAX_PRIORITY}"]
    return priority


def _clean_depends(raw):
    """→ ``[(job id | "@name", [statuses])]``; ids are checked to exist."""
    if not isinstance(raw, list):
        raise serializers.ValidationError(["a list of job ids or [job id, [statuses]]"])
    if len(raw) > MAX_DEPENDS:
        raise serializers.ValidationError([f"at most {MAX_DEPENDS} dependencies"])
    out, seen = [], set()
    for item in raw:
        if isinstance(item, (list, tuple)) and len(item) != 2:
            raise serializers.ValidationError([f"{str(item)[:60]}: expected [job id, [statuses]]"])
        target, statuses = item if isinstance(item, (list, tuple)) else (item, ["success"])
        if isinstance(target, bool) or not (
            (isinstance(target, int) and 0 < target <= MAX_ID)
            or (isinstance(target, str) and target.startswith("@"))
            or (isinstance(target, Job) and target.pk)
        ):
            raise serializers.ValidationError([f"{str(target)[:40]!r}: a job id (positive integer) or @name"])
        if not isinstance(statuses, list) or any(s not in Job.FINAL for s in statuses):
            raise serializers.ValidationError(
                [f"job {target}: accepted statuses must be a list of {', '.join(Job.FINAL)} (empty: any)"]
            )
        if target in seen:
            raise serializers.ValidationError([f"job {target} is listed twice"])
        seen.add(target)
        out.append((target, sorted(set(statuses))))
    ids = {t for t, _ in out if isinstance(t, int) and not isinstance(t, bool)}
    found = set(Job.objects.filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()
    missing = sorted(ids - found)
    if missing:
        raise serializers.ValidationError([f"job {missing[0]} does not exist"])
    return out


def _batch_order(cleaned):
    """Topological order of a batch's @name references; refuses unknown names and cycles."""
    names = {}
    for index, spec in enumerate(cleaned):
        if spec["name"]:
            if spec["name"] in names:
                raise serializers.ValidationError({"jobs": {index: {"name": ["used twice in this batch"]}}})
            names[spec["name"]] = index
    edges = {}
    for index, spec in enumerate(cleaned):
        refs = []
        for target, _ in spec["depends"]:
            if isinstance(target, str):
                if target[1:] not in names:
                    raise serializers.ValidationError({"jobs": {index: {"depends": [f"no job named {target} here"]}}})
                refs.append(names[target[1:]])
        edges[index] = refs
    order, state = [], {}

    def visit(index, path):
        if state.get(index) == "done":
            return
        if state.get(index) == "active":
            loop = path[path.index(index) :] + [index]
            shown = " → ".join(cleaned[i]["name"] or f"#{i}" for i in loop)
            raise serializers.ValidationError({"depends": [f"dependency cycle: {shown}"]})
        state[index] = "active"
        for ref in edges[index]:
            visit(ref, [*path, index])
        state[index] = "done"
        order.append(index)

    for index in range(len(cleaned)):
        visit(index, [])
    return order, names


def _check_cycles(cleaned, parent):
    """A child that depends on a job that (transitively) waits for the parent would never run."""
    if parent is None:
        return
    starts = {t for spec in cleaned for t, _ in spec["depends"] if isinstance(t, int)}
    if parent.pk in starts:
        raise serializers.ValidationError({"depends": [f"job {parent.pk} is this job's parent: a dependency cycle"]})
    seen, frontier = set(), set(starts)
    while frontier and len(seen) < MAX_CYCLE_SEARCH:
        seen |= frontier
        live = set(Job.objects.filter(pk__in=frontier).exclude(status__in=Job.FINAL).values_list("pk", flat=True))
        after = set(JobDependency.objects.filter(job_id__in=live).values_list("on_id", flat=True))
        kids = set(Job.objects.filter(parent_id__in=live).values_list("pk", flat=True))
        reached = after | kids
        if parent.pk in reached:
            raise serializers.ValidationError(
                {"depends": [f"dependency cycle: a dependency waits, through others, for parent job {parent.pk}"]}
            )
        frontier = reached - seen


def _create(spec, depends, actor, submitter, base_trail, parent, child_key, retry_of, known=None):
    trail = [*base_trail]
    if parent is not None:
        trail.append(reasons.entry(f"vclmgr:expand:job {parent.pk}", f"child of job {parent.pk} ({parent.opcode})"))
    trail += spec["reasons"]
    trail.append(reasons.entry("vclmgr:submit", f"submitted by {actor.label}"))
    known = known or {}
    # Dependencies whose status the caller holds, all unfinished: the job starts waiting (no
    # read of their status, no second write of its own).
    waits = bool(depends) and all(known.get(on) in Job.PENDING or known.get(on) == S.RUNNING for on, _ in depends)
    initial = {"status": S.WAITING, "waiting_for": _waiting_for([on for on, _ in depends])} if waits else {}
    job = Job.objects.create(
        opcode=spec["op"].name,
        params=spec["params"],
        priority=spec["priority"],
        submitter=submitter,
        reason=trail,
        buckets=reasons.buckets(trail),
        locks=spec["locks"],
        parent=parent,
        child_key=child_key,
        retry_of=retry_of,
        progress={"done": 0, "total": None, "step": None},
        has_deps=bool(depends),
        **initial,
    )
    if depends:
        JobDependency.objects.bulk_create([JobDependency(job=job, on_id=on, accepted=s) for on, s in depends])
        Job.objects.filter(pk__in=[on for on, _ in depends], has_dependents=False).update(has_dependents=True)
    changelog.record(
        job,
        "create",
        actor,
        {"opcode": [None, job.opcode], "params": [None, job.params]},
        reason=spec["reasons"][-1][1] if spec["reasons"] else "",
    )
    transitions.log(job, f"queued by {actor.label}: {job.opcode}")
    if waits:
        transitions.emit_status(job)
    else:
        _initial_state(job, depends)
    return job


def _waiting_for(unfinished):
    # No status in the text: the dispatcher does not look at the job again until its
    # dependencies have ended, so it would go stale.
    more = f" and {len(unfinished) - 1} more" if len(unfinished) > 1 else ""
    return f"dependency: job {unfinished[0]}{more}"


def _initial_state(job, depends):
    """Waiting while a dependency runs; failed at once if one already ended badly."""
    if not depends:
        transitions.emit_status(job)
        return
    states = dict(Job.objects.filter(pk__in=[on for on, _ in depends]).values_list("pk", "status"))
    for on, accepted in depends:
        status = states[on]
        if status in Job.FINAL and accepted and status not in accepted:
            with transaction.atomic(savepoint=False):  # in submit_batch's transaction (and batch)
                QueueSettings.lock()
                message = f"dependency job {on} ended {status}; accepted: {', '.join(accepted)}"
                failed = transitions.end_pending(job.pk, S.ERROR, kind="dependency", message=message)
                if failed:
                    transitions.settle(failed)
            job.refresh_from_db()
            return
    unfinished = [on for on, _ in depends if states[on] not in Job.FINAL]
    if unfinished:
        job.status, job.waiting_for = S.WAITING, _waiting_for(unfinished)
        Job.objects.filter(pk=job.pk).update(status=job.status, waiting_for=job.waiting_for)
    transitions.emit_status(job)


# --- cancel, retry, archive -----------------------------------------------------------
def cancel(job, *, actor, reason=""):
    """Queued and waiting jobs end at once; running ones stop between steps. Returns the job."""
    actor = Actor.of(actor)
    _check_may_cancel(actor.user, job)
    why = f"canceled by {actor.label}" + (f": {reason}" if reason else "")
    with transaction.atomic():
        QueueSettings.lock()
        job.refresh_from_db()
        before = job.status
        if job.is_final:
            raise Conflict(f"job {job.pk} already ended ({job.status})")
        if job.status == S.RUNNING:
            if job.cancel_requested:
                raise Conflict(f"job {job.pk} is already being canceled")
            transitions.request_cancel(job, actor=actor, reason=reason)
            changes = {"cancel_requested": [False, True]}
        else:
            ended = transitions.end_pending(job.pk, S.CANCELED, kind="canceled", message=why)
            if ended:
                transitions.settle(ended)
            changes = {"status": [before, S.CANCELED]}
            wake.after_commit(1)  # what waited for it (dependents, lock order) may start
        changelog.record(job, "state", actor, changes, reason=reason)
    job.refresh_from_db()
    return job


def hold(job, key, limit, *, actor, reason):
    """Put a pending job in the rate-limit bucket ``key`` besides its trail's: at most ``limit``
    of the bucket's jobs run at once, and ``limit`` 0 keeps it queued until ``release`` (Ganeti's
    job filter PAUSE and RATE_LIMIT). False when the job is no longer pending."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(pk=job.pk, status__in=Job.PENDING).first()
        if locked is None:
            return False
        locked.buckets = [*[b for b in locked.buckets if b[0] != key], [key, limit]]
        locked.save(update_fields=["buckets"])
        changelog.record(locked, "update", actor, {"buckets": [job.buckets, locked.buckets]}, reason)
    job.buckets = locked.buckets
    return True


def release(key, *, actor, reason):
    """Take the bucket ``key`` off every pending job (``hold``'s undoing); returns those jobs."""
    with transaction.atomic():
        # JSON containment is not portable (SQLite has none): the few pending jobs are read.
        pending = Job.objects.select_for_update().filter(status__in=Job.PENDING).exclude(buckets=[])
        held = [job for job in pending if any(b[0] == key for b in job.buckets)]
        for job in held:
            before, job.buckets = job.buckets, [b for b in job.buckets if b[0] != key]
            job.save(update_fields=["buckets"])
            changelog.record(job, "update", actor, {"buckets": [before, job.buckets]}, reason)
        if held:
            wake.after_commit(len(held))
    return held


def retry(job, *, actor, reason="", capped=False):
    """Submit a failed or canceled job again, as a new job linked to it (``retry_of``);
    ``capped`` as for ``submit_batch``."""
    actor = Actor.of(actor)
    job.refresh_from_db()
    if job.status not in (S.ERROR, S.CANCELED):
        raise Conflict(f"only failed or canceled jobs can be retried; job {job.pk} is {job.status}")
    note = f"retry of job {job.pk}" + (f": {reason}" if reason else "")
    trail = [*job.reason, reasons.entry("vclmgr:retry", note)]
    new = submit(
        job.opcode,
        job.params,
        actor=actor,
        submitter=job.submitter,
        trail=trail,
        priority=job.priority,
        retry_of=job,
        capped=capped,
    )
    transitions.log(job, f"retried as job {new.pk} by {actor.label}")
    return new


def archive(older_than_days, *, actor, reason=""):
    """Hide finished jobs that ended more than N days ago from default listings; returns how many."""
    if isinstance(older_than_days, bool) or not isinstance(older_than_days, int) or older_than_days < 0:
        raise serializers.ValidationError({"older_than_days": ["must be a whole number of days, 0 or more"]})
    cutoff = timezone.now() - timedelta(days=older_than_days)
    actor = Actor.of(actor)
    with transaction.atomic():
        ids = list(
            Job.objects.filter(status__in=Job.FINAL, archived=False, ended__lt=cutoff).values_list("pk", flat=True)
        )
        for start in range(0, len(ids), 500):
            Job.objects.filter(pk__in=ids[start : start + 500]).update(archived=True)
        content_type = ContentType.objects.get_for_model(Job)
        ObjectChange.objects.bulk_create(
            [
                ObjectChange(
                    user=actor.user,
                    actor=actor.label[:150],
                    action="update",
                    content_type=content_type,
                    object_id=str(pk),
                    object_repr=f"job {pk}",
                    changes={"archived": [False, True]},
                    reason=reason or f"ended more than {older_than_days} days ago",
                )
                for pk in ids
            ],
            batch_size=500,
        )
    return len(ids)


# --- the queue ------------------------------------------------------------------------
def _bounded_int(name, value, low, high):
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,12}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise serializers.ValidationError({name: ["must be a whole number"]})
    if not low <= value <= high:
        raise serializers.ValidationError({name: [f"must be between {low} and {high}"]})
    return value


def set_queue_settings(*, actor, limit=None, lease_seconds=None, max_attempts=None, reason=""):
    """Tune the queue at run time (the next claim reads the new values)."""
    actor = Actor.of(actor)
    wanted = {}
    errors = {}
    for name, value, bounds in (
        ("limit", limit, QueueSettings.LIMIT_RANGE),
        ("lease_seconds", lease_seconds, QueueSettings.LEASE_RANGE),
        ("max_attempts", max_attempts, QueueSettings.ATTEMPTS_RANGE),
    ):
        if value is None:
            continue
        try:
            wanted[name] = _bounded_int(name, value, *bounds)
        except serializers.ValidationError as exc:
            errors.update(exc.detail)
    if errors:
        raise serializers.ValidationError(errors)
    with transaction.atomic():
        row = QueueSettings.lock()
        before = {name: getattr(row, name) for name in wanted}
        for name, value in wanted.items():
            setattr(row, name, value)
        changes = changelog.diff(before, wanted, list(wanted))
        if changes:
            row.save()
            changelog.record(row, "update", actor, changes, reason=reason)
            events.emit("queue.settings", {**queue_state(row), "by": actor.label}, ["admin"])
        if "limit" in changes and changes["limit"][1] > changes["limit"][0]:
            wake.after_commit(dispatcher.eligible_count())
    return row


def queue_state(row=None, *, viewer=None):
    """The tunables and what the queue holds now. A user ``viewer`` sees counts of everyone's
    jobs but only the rate-limit buckets (labels from their reasons) of their own."""
    row = row or QueueSettings.get()
    counts = dict(
        Job.objects.filter(status__in=[S.QUEUED, S.WAITING, S.RUNNING])
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    running = Job.objects.filter(status=S.RUNNING)
    if viewer is not None and not access.can(viewer, "see_cluster"):
        running = running.filter(submitter=viewer)
    running = running.values_list("buckets", flat=True)
    in_bucket = {}
    for buckets in running:
        for key, n in buckets:
            in_bucket.setdefault(key, [n, 0])[1] += 1
    awaiting = Job.objects.filter(status=S.WAITING, awaiting_children=True).count()
    return {
        "limit": row.limit,
        "lease_seconds": row.lease_seconds,
        "max_attempts": row.max_attempts,
        "running": counts.get(S.RUNNING, 0),
        "queued": counts.get(S.QUEUED, 0),
        "waiting": counts.get(S.WAITING, 0),
        "awaiting_children": awaiting,
        "buckets": [
            {"reason": key, "label": reasons.label(key), "size": n, "running": count}
            for key, (n, count) in sorted(in_bucket.items())
        ],
        "updated": row.updated.isoformat(),
    }
