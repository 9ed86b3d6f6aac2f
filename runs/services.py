"""Every write of batch runs: one function per verb (``actor=`` keyword-only).

``submit`` validates everything (platform → image, size, command, environment, input files,
artifact patterns, time limit, quotas) before anything is written, then records the run, its
input files and the ``run.execute`` job in one transaction (files stored first and removed
again if it fails). ``cancel`` ends a queued run at once and asks a running one to stop (its
job destroys the VM). The job's steps (``opcodes.py``) write through ``set_state``,
``append_output``, ``store_artifact`` and ``finish``, each idempotent, so a retried step
changes nothing twice. Each change is in the run's reason trail and emitted as an event on
``run.<id>`` (and the owner's ``user.<id>``) after commit (the outbox).
"""

import logging
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts import access
from capacity import preemption
from capacity import services as capacity
from core import changelog, events
from core.changelog import Actor
from core.errors import Conflict
from drivers import registry as drivers
from environments import services as environment_services
from jobs import kept_records, reasons
from jobs import services as jobs
from jobs.models import Job
from provisioning import quotas
from provisioning import services as vms
from provisioning.models import VM
from runs import platforms, validation
from runs.models import ACTIVE, FINAL, Run, RunFile, RunOutput

log_ = logging.getLogger(__name__)
# Job priority of each run class: below interactive work (reservations' jobs run at 0).
JOB_PRIORITY = {"low": -10, "batch": -5, "high": 0}
S = Run.State
EVENT_TEXT_BYTES = 64 << 10  # output pushed in an event; a bigger chunk is read from the log API


def storage():
    return storages["runs"]


def visible(user):
    """The runs ``user`` may read: their own; an auditor's or admin's: all."""
    if access.can(user, "see_all"):
        return Run.objects.all()
    return Run.objects.filter(owner=user)


def changeable(user):
    """The runs ``user`` may cancel: their own; an admin's: all (an auditor changes nothing)."""
    if access.is_admin(user):
        return Run.objects.all()
    return Run.objects.filter(owner=user)


def may_see(user, rest):
    """Topic authoriser for ``run.<id>``: its owner, auditors and admins."""
    if not rest.isdigit() or len(rest) > 18:
        return False
    return access.can(user, "see_all") or Run.objects.filter(pk=int(rest), owner=user).exists()


def holdings(window):
    """The quota engine's holder for runs: each active one that may still hold a VM in the
    window (its VM is not counted as an ad-hoc VM: it is the run's)."""
    rows = Run.objects.filter(state__in=ACTIVE, hold_until__gt=window.start)
    if window.end is not None:
        rows = rows.filter(created__lt=window.end)
    rows = window.narrow(rows, "run", user="owner_id", group="owner__groups")
    return rows.values_list("vcpus", "memory_mib")


def uses(t0, t1, now):
    """Showback's source for runs (``provisioning.usage.SOURCES``): each run whose command ran
    in ``[t0, t1)``, from its start to its end (``now`` while it runs, its suspension while
    suspended), less the time it spent suspended before (taken off its end: when is not kept)."""
    from provisioning.usage import Use

    rows = (
        Run.objects.filter(started__lt=t1)
        .filter(Q(ended__isnull=True) | Q(ended__gt=t0))
        .order_by()
        .values_list(
            "owner_id",
            "image__name",
            "vcpus",
            "memory_mib",
            "state",
            "started",
            "ended",
            "suspended_at",
            "suspended_seconds",
        )
    )
    for owner, image, vcpus, memory_mib, state, started, ended, suspended_at, suspended in rows:
        end = ended or (suspended_at if state == Run.State.SUSPENDED and suspended_at else now)
        yield Use("run", owner, image, started, min(end, now) - timedelta(seconds=suspended or 0), vcpus, memory_mib)


# --- submit -----------------------------------------------------------------------------


def resolve(owner, platform="", image=None):
    """The image a run uses: the named one (if the owner may use it) or the first image that
    provides the platform and that some online host can run. ``ValidationError`` otherwise."""
    if bool(platform) == (image is not None):
        raise ValidationError({"platform": ["give a platform or an image, one of them"]})
    try:
        if image is not None:
            if not vms.visible_images(owner).filter(pk=image.pk, active=True).exists():
                raise platforms.NoPlatform("no such image, or you may not use it")
            return platforms.usable([image])[0]
        return platforms.usable(platforms.images_for(owner, platform))[0]
    except platforms.NoPlatform as exc:
        raise ValidationError({"image" if image is not None else "platform": [str(exc)]}) from None


def _environment(owner, template, platform, image, size):
    """``(template, entry image, every machine's size added up)`` of an environment run
    (``template``: one or its id), or ``ValidationError``."""
    if platform or image is not None or any(v is not None for v in size):
        raise ValidationError({"environment": ["an environment run takes its images and sizes from the template"]})
    template_id = getattr(template, "pk", template)
    template = environment_services.visible_templates(owner).filter(pk=template_id, active=True).first()
    if template is None:
        raise ValidationError({"environment": ["no such environment, or you may not use it"]})
    machines = environment_services.expand(template)
    for machine in machines:
        resolve(owner, image=machine.image)  # each usable by the owner, with a variant some host runs
    entry = next(m for m in machines if m.entry)
    return template, entry.image, {k: sum(m.size[k] for m in machines) for k in ("vcpus", "memory_mib", "disk_gib")}


def _copies(template):
    """``{image: how many machines of it}`` of an environment."""
    found = {}
    for machine in environment_services.expand(template):
        found[machine.image] = found.get(machine.image, 0) + 1
    return found


def _inputs(inputs):
    """``[(path, bytes)]`` from ``{path: bytes | file}`` or pairs, checked against the limits."""
    items = list(inputs.items() if isinstance(inputs, dict) else inputs or [])
    if len(items) > validation.MAX_INPUTS:
        raise ValidationError({"inputs": [f"at most {validation.MAX_INPUTS} input files"]})
    cleaned, total = [], 0
    for path, content in items:
        try:
            path = validation.input_path(path)
        except ValidationError as exc:
            raise ValidationError({"inputs": exc.messages}) from None
        size = len(content) if isinstance(content, bytes) else content.size
        total += size
        if total > settings.RUN_INPUT_MAX_BYTES:
            raise ValidationError(
                {
                    "inputs": [
                        f"input files are over the limit of {settings.RUN_INPUT_MAX_BYTES} bytes (RUN_INPUT_MAX_BYTES)"
                    ]
                }
            )
        cleaned.append((path, content if isinstance(content, bytes) else content.read()))
    if len({p for p, _ in cleaned}) != len(cleaned):
        raise ValidationError({"inputs": ["two input files have the same path"]})
    return cleaned


def submit(
    *,
    actor,
    owner,
    platform="",
    image=None,
    argv=None,
    script="",
    env=None,
    artifacts=(),
    inputs=(),
    time_limit=None,
    priority="batch",
    vcpus=None,
    memory_mib=None,
    disk_gib=None,
    keep_failed_minutes=0,
    capture_failed=False,
    reason="",
    environment=None,
):
    """Validate and record a run and queue its ``run.execute`` job; returns the run.

    ``environment``: a template instead of a platform or image: every machine of it is built,
    the command runs on its entry machine (its artifacts come from there), and the run holds
    (and its quotas count) every machine's size added up; it is never pooled, kept or suspended.
    Nothing is created when anything is refused (``ValidationError`` per field; a quota's
    refusal names its rule)."""
    if environment is not None:
        environment, image, size = _environment(owner, environment, platform, image, (vcpus, memory_mib, disk_gib))
        keep_failed_minutes, capture_failed = 0, False  # its machines go with the run
    else:
        image = resolve(owner, platform, image)
    argv, script = validation.command(argv, script)
    env = validation.environment(env)
    artifacts = validation.artifact_patterns(artifacts)
    time_limit = validation.time_limit(time_limit)
    keep_failed_minutes, capture_failed = validation.keep_failed(keep_failed_minutes, capture_failed)
    if priority not in JOB_PRIORITY:
        raise ValidationError({"priority": [f"one of {', '.join(JOB_PRIORITY)}"]})
    files = _inputs(inputs)
    if environment is None:
        size = vms.size_for(image, vcpus, memory_mib, disk_gib)
    errors = {
        f: [f"{image.name} needs at least {low}"]
        for f, low in (
            ("vcpus", image.min_vcpus),
            ("memory_mib", image.min_memory_mib),
            ("disk_gib", image.min_disk_gib),
        )
        if size[f] < low
    }
    if errors and environment is None:
        raise ValidationError(errors)
    now = timezone.now()
    hold_until = now + timedelta(minutes=settings.RUN_BOOT_MINUTES, seconds=time_limit)
    limited = not access.is_admin(owner)
    # Each image's copies in the run: one, or an environment's machines of it (a licence cap counts them).
    copies = _copies(environment) if environment is not None else {image: 1}
    if limited:
        errors = quotas.check(owner, image, now, hold_until, size, when_field=NON_FIELD_ERRORS, copies=copies[image])
        errors.pop("end", None)  # a run's length is its time limit, checked above, not a reservation's
        if errors:
            raise ValidationError(errors)
    stored = []
    try:
        with transaction.atomic():
            for counted, count in copies.items() if limited else ():
                try:
                    quotas.check_locked(
                        owner, counted, now, hold_until, size, when_field=NON_FIELD_ERRORS, copies=count
                    )
                except ValidationError as exc:
                    if set(exc.message_dict) - {"end"}:
                        raise ValidationError({k: v for k, v in exc.message_dict.items() if k != "end"}) from None
            trail = [reasons.entry(f"vclmgr:run:{Actor.of(actor).label}"[:64], reason or "submitted")]
            run = Run.objects.create(
                owner=owner,
                platform=platform or "",
                image=image,
                argv=argv,
                script=script,
                env=env,
                artifacts=artifacts,
                time_limit=time_limit,
                priority=priority,
                hold_until=hold_until,
                reason=trail,
                keep_failed_minutes=keep_failed_minutes,
                capture_failed=capture_failed,
                environment=environment,
                counted_machines=environment_services.counted(environment_services.expand(environment))
                if environment is not None
                else [],
                **size,
            )
            for path, data in files:
                name = storage().save(f"{run.pk}/input/{path}", ContentFile(data))
                stored.append(name)
                RunFile.objects.create(run=run, kind=RunFile.Kind.INPUT, path=path, size=len(data), stored=name)
            job = jobs.submit(
                "run.execute",
                {"run": run.pk},
                actor=actor,
                submitter=owner,
                priority=JOB_PRIORITY[priority],
                reason=reason or f"run {run.pk}",
            )
            Run.objects.filter(pk=run.pk).update(job=job.pk)
            run.job = job.pk
            changelog.record(run, "create", actor, reason=reason or "submitted")
            _emit(run)
    except BaseException:
        for name in stored:
            storage().delete(name)
        raise
    return run


# --- state, output, files (the job's writes) -----------------------------------------------


def _emit(run, kind="run.changed", data=None):
    payload = data or {"run": run.pk, "state": run.state, "exit_status": run.exit_status, "error": run.error}
    events.emit(kind, payload, [f"run.{run.pk}", f"user.{run.owner_id}"])


def set_state(run_id, state, message, *, actor, unless_final=True, **fields):
    """Move the run to ``state`` (with ``fields``) and add ``message`` to its trail; a final
    run is left alone (returns None), so a late step cannot undo an end. In a job's run it
    writes the step records the run keeps (``kept_records``)."""
    with transaction.atomic(), kept_records.carrying():
        run = Run.objects.select_for_update().get(pk=run_id)
        if unless_final and run.is_final:
            return None
        before = run.state
        run.state = state
        for name, value in fields.items():
            setattr(run, name, value)
        run.reason = [*run.reason, reasons.entry("vclmgr:run", message)]
        run.save()
        changelog.record(run, "state", actor, {"state": [before, state]}, reason=message)
        _emit(run)
        if run.is_final and before not in FINAL:  # told once, by mail if the owner wants it
            finished = {"id": run.pk, "status": state, "exit_status": run.exit_status, "reason": message}
            events.emit("run.finished", finished, [f"user.{run.owner_id}"])
    return run


def append_output(run_id, offset, data):
    """Add output printed from ``offset`` on; idempotent (what was already added is skipped).
    Past ``RUN_OUTPUT_MAX_BYTES`` bytes are counted and dropped. In a job's run it writes the
    step records the run keeps (``kept_records``)."""
    with transaction.atomic(), kept_records.carrying():
        run = Run.objects.select_for_update().get(pk=run_id)
        skip = run.output_seen - offset
        if skip >= len(data) or skip < 0:
            return run.output_seen
        data = data[skip:]
        keep = data[: max(0, settings.RUN_OUTPUT_MAX_BYTES - run.output_kept)]
        fields = {"output_seen": F("output_seen") + len(data)}
        if keep:
            seq = run.output_chunks
            RunOutput.objects.create(run=run, seq=seq, offset=run.output_kept, data=keep)
            fields.update(output_kept=F("output_kept") + len(keep), output_chunks=F("output_chunks") + 1)
            # A big chunk is not pushed whole: the page fetches it from the log API (``more``).
            text = keep.decode("utf-8", "replace") if len(keep) <= EVENT_TEXT_BYTES else ""
            _emit(run, "run.output", {"run": run.pk, "seq": seq, "text": text, "more": not text})
        Run.objects.filter(pk=run.pk).update(**fields)
        return run.output_seen + len(data)


def store_artifact(run_id, path, data):
    """Keep one artifact (idempotent per path)."""
    path = validation.artifact_path(path)
    if RunFile.objects.filter(run_id=run_id, kind=RunFile.Kind.ARTIFACT, path=path).exists():
        return
    name = storage().save(f"{run_id}/artifact/{path}", ContentFile(data))
    RunFile.objects.create(run_id=run_id, kind=RunFile.Kind.ARTIFACT, path=path, size=len(data), stored=name)


def finish(run_id, state, message, *, actor, exit_status=None, error=""):
    return set_state(
        run_id, state, message, actor=actor, exit_status=exit_status, error=error[:4000], ended=timezone.now()
    )


def cancel(run, *, actor, reason=""):
    """A queued run ends at once; a running one stops at its job's next look (its VM destroyed)."""
    run.refresh_from_db()
    if run.is_final:
        raise Conflict(f"run {run.pk} already ended ({run.state})")
    who = Actor.of(actor).label
    why = f"canceled by {who}" + (f": {reason}" if reason else "")
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    job = Job.objects.filter(pk=run.job).first() if run.job else None
    # Suspended with no job to drive it (a pending resume canceled below gets run.cleanup from
    # ``job_ended``): a job of its own destroys its VM.
    idle = run.state == S.SUSPENDED and (job is None or job.is_final)
    if job is not None and not job.is_final and job.opcode in DRIVING:  # a run.cleanup ends it anyway
        try:
            # As the run's own agent: the user may cancel the run, not the system's job directly.
            # A queued job ends at once; a running one stops at its next step, and its handler
            # destroys the VM (a waiting command also sees cancel_requested at its next look).
            jobs.cancel(job, actor=f"run {run.pk} ({who})", reason=reason or "run canceled")
        except Conflict:
            pass  # it ended or is being canceled meanwhile
        job.refresh_from_db()
    if job is not None and job.status == Job.Status.CANCELED and run.vm_id is None:
        finish(run.pk, S.CANCELED, why, actor=actor)  # never started: nothing to tear down
    elif idle:
        set_state(run.pk, run.state, f"{why}; destroying its suspended VM", actor=actor)
        jobs.submit("run.cleanup", {"run": run.pk}, actor=f"run {run.pk} ({who})", reason=f"run {run.pk}: {why}")
    else:
        set_state(run.pk, run.state, f"{why}; stopping", actor=actor)
    run.refresh_from_db()
    return run


# --- reading ---------------------------------------------------------------------------------


def log(run, after=-1, limit=100):
    """Output chunks after sequence number ``after``: ``(chunks, next_after)``."""
    chunks = list(RunOutput.objects.filter(run=run, seq__gt=after).order_by("seq")[:limit])
    return chunks, (chunks[-1].seq if chunks else after)


def truncation_note(run):
    if run.files_removed:
        return RETENTION_NOTE
    if not run.truncated:
        return ""
    return f"[vclmgr: output truncated: {run.output_kept} bytes kept of {run.output_seen} (RUN_OUTPUT_MAX_BYTES)]"


# --- a run whose job ended without ending it ----------------------------------------------------


def job_ended(kind, data, topics, ids):
    """Listener of ``job.status``: a ``run.execute`` job that ended (a lost worker on its last
    attempt, an error outside its own handling) while its run had not ended gets a
    ``run.cleanup`` job, submitted once this commits: the VM never outlives its run."""
    if data.get("opcode") not in DRIVING or data.get("status") not in (Job.Status.ERROR, Job.Status.CANCELED):
        return
    run = Run.objects.filter(job=data["id"]).exclude(state__in=FINAL).only("pk", "owner_id").first()
    if run is None:
        return
    transaction.on_commit(
        lambda: jobs.submit(
            "run.cleanup", {"run": run.pk}, actor=f"run {run.pk}", reason=f"run {run.pk}: its job {data['id']} ended"
        )
    )


DRIVING = ("run.execute", "run.resume")  # the jobs that drive a run (``Run.job``)


# --- suspend instead of preempt ---------------------------------------------------
# A reservation (or other claim of a higher class: ``capacity.preemption``) that
# fits nowhere may take the CPU and memory of running runs of a lower class: ``suspend_for``,
# in the claiming transaction, shrinks each run's claim to its disk and asks its job to suspend
# its VM (the job's wait step sees ``suspend_requested``, suspends, and ends; the claimer's
# build waits for that job). ``resume_suspended`` (the housekeeping's, and after any claim is
# released) claims a suspended run's size back on its host where it fits again and submits
# ``run.resume``, which resumes the VM and goes on waiting for the command where it was.


def preemptible():
    """The claims of runs whose command runs and which may be suspended now:
    ``(allocation id, host id, class)`` (``preemption.Holder.candidates``)."""
    rows = Run.objects.filter(
        state=S.RUNNING,
        environment__isnull=True,  # its machines together, or not at all: never suspended
        started__isnull=False,
        cancel_requested=False,
        suspend_requested=False,
        vm__state=VM.State.RUNNING,
        vm__allocation__released__isnull=True,
    ).exclude(vm__allocation__vcpus=0, vm__allocation__memory_mib=0)
    return list(rows.values_list("vm__allocation_id", "vm__host_id", "priority"))


def suspend_for(allocation_ids, *, actor, reason):
    """Suspend the runs holding these claims (``preemption.Holder.suspend``; in the claimer's
    transaction): each claim becomes one for its disk alone, each run is asked to suspend.
    The ids of their jobs (whose end means the VM is suspended, or gone). ``preemption.Gone``
    when one of them can no longer be suspended."""
    rows = Run.objects.select_for_update(of=("self",)).filter(vm__allocation_id__in=allocation_ids)
    runs = list(rows.filter(state=S.RUNNING, cancel_requested=False, suspend_requested=False))
    if len(runs) != len(set(allocation_ids)):
        raise preemption.Gone(f"{len(set(allocation_ids)) - len(runs)} of the runs to suspend ended or changed")
    for run in runs:
        vms.suspend_claim(run.vm_id, f"its CPU and memory given back to suspend it: {reason}", actor=actor)
        set_state(
            run.pk, run.state, f"to be suspended ({run.priority} class): {reason}", actor=actor, suspend_requested=True
        )
    return [run.job for run in runs if run.job]


def suspended(run_id, *, actor):
    """The run's job suspended its VM (to disk): the run is ``suspended`` from now."""
    run = Run.objects.select_related("vm__host").get(pk=run_id)
    return set_state(
        run_id,
        S.SUSPENDED,
        f"suspended: its VM {run.vm.key} saved to disk on {run.vm.host.name}",
        actor=actor,
        suspend_requested=False,
        suspended_at=timezone.now(),
    )


def resumed(run_id, *, actor):
    """The run's VM runs again: the time it spent suspended is added to what its limit ignores."""
    run = Run.objects.select_related("vm__host").get(pk=run_id)
    away = (timezone.now() - run.suspended_at).total_seconds() if run.suspended_at else 0.0
    return set_state(
        run_id,
        S.RUNNING,
        f"resumed on {run.vm.host.name} after {away:.0f} s suspended",
        actor=actor,
        suspended_seconds=run.suspended_seconds + away,
        suspended_at=None,
    )


def _resumable():
    """Suspended runs no job is about to resume, the highest class and the longest waiting first."""
    rows = Run.objects.filter(state=S.SUSPENDED, cancel_requested=False, vm__isnull=False)
    rows = rows.order_by("suspended_at", "pk")
    busy = set(Job.objects.filter(pk__in=rows.values("job")).exclude(status__in=Job.FINAL).values_list("pk", flat=True))
    waiting = [
        run for run in rows.select_related("vm", "vm__host__credential", "vm__allocation") if run.job not in busy
    ]
    return sorted(waiting, key=lambda run: -preemption.RANKS[run.priority])


def resume_suspended(*, actor):
    """Resume each suspended run whose size fits its host again: its claim back (until its
    latest end, moved on by the time it spent suspended) and a ``run.resume`` job, in one
    transaction; of two callers racing for a run, one does it. Returns how many."""
    done = 0
    for run in _resumable():
        host = run.vm.host
        if host.state == host.State.OFFLINE:  # its memory and disk went with the host
            _attempt(
                _hand_over,
                run,
                "run.cleanup",
                f"its host {host.name} went offline while it was suspended: ending it",
                actor=actor,
            )
        elif host.state == host.State.ONLINE and _attempt(_resume_one, run, actor=actor):
            done += 1
        elif drivers.driver_for(host).moves_suspended and _attempt(_move_one, run, actor=actor):
            done += 1  # its host is full or drained: resumed where it fits, moved there with its memory
    return done


def _attempt(fn, *args, **kwargs):
    """True when ``fn`` did it; False when there is no room or another caller was first."""
    try:
        fn(*args, **kwargs)
    except (capacity.NoCapacity, capacity.TryAgain, capacity.Released, _Raced):
        return False
    return True


def _latest_end(run):
    """The run's latest end, moved on by the time it has spent suspended so far."""
    return run.hold_until + (timezone.now() - (run.suspended_at or timezone.now()))


def _resume_one(run, *, actor):
    hold_until = _latest_end(run)
    with transaction.atomic():
        vms.resume_claim(run.vm_id, hold_until, f"room returned: resuming run {run.pk}", actor=actor)
        _hand_over(
            run, "run.resume", f"room returned on {run.vm.host.name}: resuming", actor=actor, hold_until=hold_until
        )


def _move_one(run, *, actor):
    """Claim the run's size on another host (its VM's target: ``run.resume`` moves it there,
    suspended, then resumes it), or ``NoCapacity``. Not the host its last move failed to reach
    (its last job's ``refused_by``): tried once, then others, or its own host when room returns."""
    vm, hold_until = run.vm, _latest_end(run)
    last = Job.objects.filter(pk=run.job).values_list("result", flat=True).first()
    refused = [last["refused_by"]] if isinstance(last, dict) and last.get("refused_by") else []
    demand = vms.vm_demand(
        vm,
        purpose=f"vm {vm.pk} (resumed elsewhere)",
        hypervisors=[vm.variant.hypervisor_type],
        exclude_hosts=[vm.host_id, *refused],
        prefer_cached=False,
    )
    with transaction.atomic():
        target = capacity.claim(replace(demand, end=hold_until), actor=actor, owner=vm.owner)
        if target.host.driver != vm.host.driver or getattr(target, "power_on_job", None):
            raise _Raced  # no move between kinds, nor onto a host still to be powered on: rolled back
        vms.set_state(
            vm.pk,
            vm.state,
            f"to be moved to {target.host.name} to resume there",
            actor=actor,
            target_allocation=target,
            end=hold_until,
        )
        _hand_over(
            run,
            "run.resume",
            f"room on {target.host.name}: moving it there to resume",
            actor=actor,
            hold_until=hold_until,
        )


def _hand_over(run, opcode, message, *, actor, **fields):
    """Submit the job that takes the suspended run on and make it the run's, if no one did
    first (a conditional UPDATE; ``_Raced`` rolls the caller's transaction back)."""
    with transaction.atomic():
        job = jobs.submit(
            opcode,
            {"run": run.pk},
            actor=actor,
            submitter=run.owner,
            priority=JOB_PRIORITY[run.priority],
            reason=f"run {run.pk}: {message}",
        )
        if not Run.objects.filter(pk=run.pk, state=S.SUSPENDED, job=run.job).update(job=job.pk, **fields):
            raise _Raced
        set_state(run.pk, S.SUSPENDED, f"{message} (job {job.pk})", actor=actor)


class _Raced(Exception):
    """Another caller resumed (or ended) the run first: roll this attempt back."""


def room_returned(kind, data, topics, ids):
    """Listener of ``allocation.released``: once that commits, suspended runs may fit again.
    (Not for a suspended run's own disk claim being swapped back: that is a resume already.)"""
    if str(data.get("purpose", "")).startswith(vms.SUSPENDED_CLAIM):
        return
    if not Run.objects.filter(state=S.SUSPENDED).exists():
        return
    transaction.on_commit(_resume_quietly)


def _resume_quietly():
    try:
        resume_suspended(actor=RESUME_ACTOR)
    except Exception:  # the housekeeping tries again within a minute; the releaser must not fail
        log_.exception("resuming suspended runs failed")


RESUME_ACTOR = Actor(name="runs resume")


# --- retention ------------------------------------------------------------------------------

RETENTION_NOTE = "[vclmgr: its output and files were removed by retention (RUNS_RETENTION_DAYS)]"
RETENTION_BATCH = 200  # runs per round: a first round after a long pause must not hold a worker long


def expire_files(*, actor, now=None):
    """Remove the output, input files and artifacts of runs that ended more than
    ``RUNS_RETENTION_DAYS`` ago (0: never); the run's row stays, marked ``files_removed``.
    Idempotent: a run is done once; a file already gone is skipped. Returns how many runs."""
    days = settings.RUNS_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    old = Run.objects.filter(state__in=FINAL, ended__lt=cutoff, files_removed__isnull=True).order_by("pk")
    ids = list(old.values_list("pk", flat=True)[:RETENTION_BATCH])
    for run_id in ids:
        _remove_files(run_id, days, actor=actor)
    return len(ids)


def _remove_files(run_id, days, *, actor):
    # Files first, outside the transaction (storage is not transactional); a crash between the
    # two leaves rows whose files are gone, and the next round deletes them again (a no-op).
    for name in RunFile.objects.filter(run_id=run_id).values_list("stored", flat=True):
        storage().delete(name)
    message = f"its output and files removed by retention ({days} days after its end)"
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.files_removed:
            return
        RunFile.objects.filter(run_id=run_id).delete()
        RunOutput.objects.filter(run_id=run_id).delete()
        run.files_removed = timezone.now()
        run.reason = [*run.reason, reasons.entry("vclmgr:run", message)]
        run.save(update_fields=["files_removed", "reason"])
        changelog.record(run, "update", actor, {"files_removed": [None, str(run.files_removed)]}, reason=message)


# --- a failed run's VM kept for inspection (post-build analysis, after ETICS) ------------------

KEEP_RETRY = timedelta(minutes=10)  # a discard that failed is tried again after this, not every round


def kept(run_id, until, message, *, actor):
    """The job kept the run's VM stopped (``vms.keep_stopped``) until ``until``: say so."""
    return set_state(
        run_id, Run.objects.get(pk=run_id).state, message, actor=actor, unless_final=False, kept_until=until
    )


def kept_vm(run):
    """The id of the run's VM while it is kept for inspection, else None."""
    if run.kept_until is None or run.vm_id is None or run.vm.state == VM.State.DESTROYED:
        return None
    return run.vm_id


def _kept():
    return Run.objects.filter(kept_until__isnull=False, vm__isnull=False).exclude(vm__state=VM.State.DESTROYED)


def discard_kept(run, *, actor, reason=""):
    """Destroy a kept VM now (its owner, or staff): the ``run.discard`` job (capture first, when
    asked). ``Conflict`` when the run keeps none."""
    if not _kept().filter(pk=run.pk).exists():
        raise Conflict(f"run {run.pk} keeps no VM")
    who = Actor.of(actor).label
    return _submit_discard(run.pk, f"run {run.pk} ({who})", reason or f"run {run.pk}: its kept VM discarded by {who}")


def discard_expired(*, actor, now=None):
    """Submit ``run.discard`` for each run whose VM's keeping time is over and that has no such
    job pending, running or tried within ``KEEP_RETRY``. Returns how many were submitted."""
    now = now or timezone.now()
    due = list(_kept().filter(kept_until__lte=now).values_list("pk", flat=True))
    recent = Q(status__in=(*Job.PENDING, Job.Status.RUNNING)) | Q(received__gt=now - KEEP_RETRY)
    jobs_of_due = Job.objects.filter(recent, opcode="run.discard", params__run__in=due)
    busy = set(jobs_of_due.values_list("params__run", flat=True))
    todo = [pk for pk in due if pk not in busy]
    for pk in todo:
        _submit_discard(pk, actor, f"run {pk}: its failed VM's keeping time is over")
    return len(todo)


def _submit_discard(run_id, actor, reason):
    return jobs.submit("run.discard", {"run": run_id}, actor=actor, reason=reason)
