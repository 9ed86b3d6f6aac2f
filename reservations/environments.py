"""Reserving an environment: several connected VMs as one reservation, all or nothing.

An environment reservation is one ``Reservation`` per machine of the template
(``environments.services.expand``), each with its own claim, VM, status and history, so each
machine is built, watched, reclaimed and torn down by the same code as any reservation. The
entry machine's reservation is the **head**: it is the one its user holds, sees and acts on
(``head`` is None on it; the others point at it). What the head does, all do:

- asked for together (``ask``): when a machine's image requires approval, one request waits for
  an approver for the whole environment (``approvals``), naming the images that need it; nothing
  is claimed meanwhile, and once approved it is reserved (``reserve``) as if never gated;
- accepted together (``reserve``): its quotas counted as one holding of every machine's size
  under the quota locks (``_check_quotas``), every machine placed in one decision with the sets
  joined by a private network on one host (``capacity.claim_gang``), their private networks
  recorded on those hosts, in one transaction; a refusal names the machine that does not fit
  and the earliest start for all, and nothing of it is written;
- ready when every machine is (``machine_ready``: the head stays provisioning until the last
  one is ready);
- a machine whose build fails, or whose host dies (``host_loss``), is built again on another
  host with the machines its networks join it to on its host, all on one host that fits them
  for the rest of the window (placed as a gang, the hosts they failed on aside), once; when
  none fits, or its retry was spent, the whole environment ends, saying which machine and why
  (``settling.machine_failed``);
- ended, canceled and extended as one (``ending``): a machine alone refuses these verbs.
"""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core import changelog
from core.changelog import Actor
from core.errors import Conflict
from environments import placing
from environments import services as environment_services
from environments.models import EnvironmentTemplate
from jobs import transitions
from provisioning import private_networks, quotas
from reservations import approvals, logins, reserving, status
from reservations.models import Reservation

S = Reservation.Status


def reserve(
    user, template, *, actor, start=None, end=None, duration=None, ssh_key="", request_key="", now=None, approved=False
):
    """Accept a reservation of ``template``'s machines; returns the head (the entry machine's).
    ``ValidationError`` (nothing written) when refused; arguments as ``reserving.reserve``.
    A machine's image that requires approval is refused unless ``approved`` (``proceed``)."""
    actor = Actor.of(actor)
    now = now or timezone.now()
    existing = reserving.made_already(user, request_key)
    if existing is not None:
        return existing
    check_template(user, template)
    start, end = reserving.window(start, end, duration, now)
    machines = environment_services.expand(template)
    _check_machines(user, machines, start, end, now, approved=approved)
    start = max(start, now)
    try:
        with transaction.atomic(), transitions.batched():
            head = _accept(user, template, machines, start, end, ssh_key, request_key, actor=actor)
            if start - timedelta(minutes=settings.RESERVATION_LEAD_MINUTES) <= now:
                for machine in [head, *head.members.order_by("pk")]:
                    reserving.provision(machine, actor=actor, savepoint=False)
    except reserving.NoRoom as exc:
        reserving.refused(user, head_image(machines), exc.reasons, now)
        raise
    except reserving.QuotaRefused as exc:
        reserving.refused(user, head_image(machines), {reserving.QUOTA: 1}, now)
        raise ValidationError(exc.message_dict) from None
    return head


def ask(user, template, *, actor, start=None, end=None, duration=None, ssh_key="", request_key="", now=None):
    """``reserve`` (the same arguments), or, when a machine's image requires approval, one request
    waiting for it for the whole environment. Returns the head or the ``ApprovalRequest``. As
    for one image (``approvals.ask_reservation``), the request is checked as the reservation
    would be (the template, every machine, the quotas) before anyone is asked; capacity is
    claimed, and checked, when it is approved."""
    machines = environment_services.expand(template)
    gated = gated_images(user, machines)
    if not gated:
        asked = {"start": start, "end": end, "duration": duration, "ssh_key": ssh_key, "request_key": request_key}
        return reserve(user, template, actor=actor, now=now, **asked)
    now = now or timezone.now()
    check_template(user, template)
    first, last = reserving.window(start, end, duration, now)
    _check_machines(user, machines, first, last, now, approved=True)
    try:
        with transaction.atomic():  # (its locks: the quotas as they are now; nothing written)
            _check_quotas(user, machines, max(first, now), last)
    except reserving.QuotaRefused as exc:
        raise ValidationError(exc.message_dict) from None
    timing, when, starts_at = approvals.asked_time(first, last, now)
    payload = {"environment": template.pk, **timing, "ssh_key": ssh_key.strip(), "images": [i.name for i in gated]}
    needs = ", ".join(image.name for image in gated)
    summary = f"a reservation of environment {template.name}{when} (approval needed for {needs})"
    return approvals.ask(
        approvals.K.ENVIRONMENT,
        user,
        gated[0],
        payload,
        summary,
        actor=actor,
        starts_at=starts_at,
        request_key=request_key,
        now=now,
    )


def proceed(request, *, actor):
    """``approvals.PROCEED`` for an environment: reserve it as asked, now (the requester's
    quotas, the capacity then, every machine placed and built as one), refused if its template
    gained an image that requires approval since it was asked for. Returns the head's id."""
    template = EnvironmentTemplate.objects.filter(pk=request.payload["environment"]).first()
    if template is None:
        raise ValidationError({"environment": ["the environment no longer exists"]})
    _check_still_approved(request, template)
    start, duration = approvals.asked_window(request.payload)
    head = reserve(
        request.requester,
        template,
        actor=actor,
        start=start,
        duration=duration,
        ssh_key=request.payload.get("ssh_key", ""),
        approved=True,
    )
    return head.pk


def _check_still_approved(request, template):
    """Refuse (ValidationError) an approval that did not cover the template as it is now: one
    of its images that requires approval was not in it when it was asked for."""
    gated = gated_images(request.requester, environment_services.expand(template))
    new = sorted(image.name for image in gated if image.name not in request.payload.get("images", ()))
    if new:
        words = f"environment {template.name} has machines of {', '.join(new)} since it was asked for"
        raise ValidationError({"environment": [f"{words}, which the approval did not cover: ask again"]})


def gated_images(user, machines):
    """The images of ``machines`` whose reservation by ``user`` waits for an approver, once each
    (a class's or a block's seat of an environment asks the same of every machine)."""
    gated = {}
    for machine in machines:
        if approvals.needs_approval(user, machine.image):
            gated.setdefault(machine.image.pk, machine.image)
    return list(gated.values())


def check_template(user, template):
    """Refuse (ValidationError) a template ``user`` may not reserve: one not theirs to see, or
    switched off."""
    if not environment_services.visible_templates(user).filter(pk=template.pk).exists():
        raise ValidationError({"environment": ["no such environment, or you may not use it"]})
    if not template.active:
        raise ValidationError({"environment": [f"environment {template.name} is inactive"]})


def visible_template(user, template_id):
    """The template ``user`` may reserve, by id; the same refusal whether it exists or not."""
    template = environment_services.visible_templates(user).filter(pk=template_id).first()
    if template is None:
        raise ValidationError({"environment": ["no such environment, or you may not use it"]})
    return template


def head_image(machines):
    return next(m for m in machines if m.entry).image


def _check_machines(user, machines, start, end, now, approved=False):
    """Each machine as a reservation of its image is checked (usable, times), named by hostname;
    an image that requires approval only once ``approved`` (``ask`` asks for it)."""
    errors = {}
    for machine in machines:
        found, _usable = reserving._validate(user, machine.image, start, end, now, machine.size, quota=False)
        if not found and not approved and approvals.needs_approval(user, machine.image):
            found = {"image": [f"image {machine.image.name} requires approval: ask for the environment to be approved"]}
        for field, messages in found.items():
            if field in ("start", "end"):  # the same window for all: said once
                errors[field] = messages
            else:
                errors.setdefault("environment", []).extend(f"{machine.hostname}: {m}" for m in messages)
    if errors:
        raise ValidationError(errors)


def accept_seat(user, template, start, end, *, block, occurrence=0, actor):
    """A class's or block's seat of ``template`` (``user`` None: a free seat), claimed all or
    nothing in the caller's transaction; returns its head. The seats are the instructor's:
    only the images' licence caps bind (``quotas``), as for a seat of one image.
    ``ValidationError`` (``reserving.NoRoom``) when it does not fit."""
    machines = environment_services.expand(template)
    check_seat_caps(machines, start, end)
    return _accept(user, template, machines, start, end, "", "", actor=actor, block=block, occurrence=occurrence)


def entry_image(template):
    """The image of ``template``'s entry machine (a class's or block's image, for its words)."""
    return template.members.get(entry=True).image


def _accept(user, template, machines, start, end, ssh_key, request_key, *, actor, block=None, occurrence=0):
    """The machines' rows, their quotas (not for a seat: ``block``), their claims and their
    networks, in the caller's transaction."""
    if block is None:
        _check_quotas(user, machines, start, end)
    rows = {}
    for machine in sorted(machines, key=lambda m: not m.entry):  # the head first: the others point at it
        head = rows.get(next(m.hostname for m in machines if m.entry))
        rows[machine.hostname] = Reservation.objects.create(
            user=user,
            image=machine.image,
            revision=machine.revision,
            environment=template,
            head=head,
            hostname=machine.hostname,
            start=start,
            end=end,
            ssh_key=ssh_key.strip() if head is None else "",
            request_key=request_key if head is None else "",
            block=block,
            occurrence=occurrence,
            **machine.size,
        )
    head = rows[next(m.hostname for m in machines if m.entry)]
    login = logins.fields_lacking(head)  # one login for every machine: its user goes from one to the next
    Reservation.objects.filter(pk__in=[r.pk for r in rows.values()]).update(
        ssh_key=head.ssh_key, connect_user=login.get("connect_user", ""), connect_secret=login.get("connect_secret", "")
    )
    purposes = {hostname: f"reservation {row.pk}" for hostname, row in rows.items()}
    try:
        claims = placing.claim(template, machines, start, end, purposes=purposes, actor=actor, owner=user)
        placing.record_networks(f"env{head.pk}", template, machines, claims)
    except placing.Refused as exc:
        raise reserving.NoRoom({"start": [exc.words]}, exc.reasons) from None
    for hostname, row in rows.items():
        allocation = claims[hostname]
        Reservation.objects.filter(pk=row.pk).update(allocation=allocation, status=S.PENDING)
        row.allocation, row.status = allocation, S.PENDING
        changelog.record(row, "create", actor, reason="reserved")
        window = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
        status.history(row, f"reserved on {allocation.host_name} as {hostname} of {template.name}, {window}")
    head.refresh_from_db()
    return head


def _check_quotas(user, machines, start, end, exclude=None):
    """The quotas and hours budgets, under their locks (``quotas.check_locked``): the
    environment is one holding of its entry image, of every machine's size added up; the
    limits of an image (a licence cap, a rule of that image) count its copies in it.
    ``exclude``: the environment being extended (``("environment", head id)``)."""
    entry = next(m for m in machines if m.entry)
    total = {k: sum(m.size[k] for m in machines) for k in ("vcpus", "memory_mib", "disk_gib")}
    copies = {}
    for machine in machines:
        copies.setdefault(machine.image.pk, [machine.image, 0])[1] += 1
    try:
        quotas.check_locked(user, entry.image, start, end, total, exclude=exclude, copies=copies[entry.image.pk][1])
        for image, count in copies.values():
            if image.pk != entry.image.pk:
                quotas.check_locked(user, image, start, end, total, exclude=exclude, copies=count)
        excluded = ("reservation", exclude[1]) if exclude else None
        over = reserving.budget_errors(user, entry.image, start, end, exclude=excluded)  # (under the same lock)
        if over:
            raise ValidationError(over)
    except ValidationError as exc:
        raise reserving.QuotaRefused(exc.message_dict) from None


def check_seat_caps(machines, start, end):
    """A class's or block's seat of an environment: only its images' licence caps bind, each
    counting its copies in the seat."""
    copies = {}
    for machine in machines:
        copies.setdefault(machine.image.pk, [machine, 0])[1] += 1
    for machine, count in copies.values():
        if machine.image.max_concurrent is not None:
            quotas.check_locked(None, machine.image, start, end, machine.size, copies=count)


def check_extension(head, new_end):
    """An environment's new end under its quotas and budgets, counted once for all its machines
    (its own holdings aside): the machines it holds, whatever its template became since;
    ``ValidationError``."""
    machines = reserved_machines(head)
    try:
        _check_quotas(head.user, machines, head.start, new_end, exclude=("environment", head.pk))
    except reserving.QuotaRefused as exc:
        raise ValidationError({"end": [m for messages in exc.message_dict.values() for m in messages]}) from None


# --- after the reservation is accepted --------------------------------------------------------


def machines_of(head):
    """Every machine's reservation of the environment ``head`` is the head of, the head first."""
    return [head, *Reservation.objects.filter(head=head).select_related("vm", "image").order_by("pk")]


def reserved_machines(head):
    """The machines the environment ``head`` holds (``machines_of``), as ``expand`` gives a
    template's: what its quotas count once it is reserved."""
    return [
        environment_services.Machine(
            hostname=row.hostname,
            member=row.hostname,
            image=row.image,
            revision=row.revision,
            vcpus=row.vcpus,
            memory_mib=row.memory_mib,
            disk_gib=row.disk_gib,
            networks=(),
            entry=row.head_id is None,
        )
        for row in machines_of(head)
    ]


def all_ready(head):
    """Are all of the environment's machines but the head ready, and the head's VM running?"""
    others = Reservation.objects.filter(head=head)
    return not others.exclude(status=S.READY).exists() and head.vm is not None and head.vm.state == "running"


def machine_ready(reservation, ready):
    """``settling``'s ready for a machine of an environment: ``ready(row)`` moves one row. A
    machine turns ready as soon as its VM is; the head only when every machine is. Both
    paths lock the head's row first, so of two machines settling at once the second sees the
    first (and the last one turns the head ready)."""
    head_id = reservation.head_id or reservation.pk
    rows = Reservation.objects.select_for_update(of=("self",)).select_related("vm", "vm__host", "image")
    head = rows.get(pk=head_id)
    if reservation.head_id is not None:
        ready(reservation)
    if head.status == S.PROVISIONING and all_ready(head):
        ready(head)
        return {"status": S.READY, "environment": head.pk}
    return {"status": reservation.status if reservation.head_id else S.PROVISIONING, "environment": head.pk}


def reach(head, machines=None):
    """How the user reaches each machine of the environment (``machines_of(head)``, the head
    first): ``{hostname: {"from_entry": [...], "direct": {...} or None}}``.

    ``from_entry``: each of its private networks, ``{"network", "address", "name",
    "shared_with_entry"}`` (its fixed address there; its name answers on that network, so
    from the entry machine when it is on it too; otherwise only through a machine on both,
    a router the template's users set up themselves). ``direct``: the machine's own login
    address and port (``logins.connection``, without the password, one login for all) when its
    host gave it one the way it gave the entry machine its own, else None: as reachable as the
    entry's address is, no more."""
    machines = machines if machines is not None else machines_of(head)
    rows = list(private_networks.of_environment(f"env{head.pk}"))
    networks = {}
    for machine in machines:
        host_id = machine.vm.host_id if machine.vm and machine.vm.host_id else None
        mine = [n for n in rows if machine.hostname in n.members and (host_id is None or n.host_id == host_id)]
        networks[machine.hostname] = {n.name: n for n in sorted(mine, key=lambda n: n.pk)}  # the latest per name
    entry = networks.get(head.hostname, {})
    answer = {}
    for machine in machines:
        own = networks[machine.hostname]
        direct = logins.connection(machine)
        if direct is not None:
            direct.pop("password", None)
            direct = direct if direct["address"] else None
        answer[machine.hostname] = {
            "from_entry": [
                {
                    "network": name,
                    "address": private_networks.address_of(network, machine.hostname),
                    "name": machine.hostname,
                    "shared_with_entry": name in entry,
                }
                for name, network in sorted(own.items())
            ],
            "direct": direct,
        }
    return answer


def forget_networks(head):
    """The networks of an environment whose machines never built (canceled, expired): their
    ranges are free again."""
    private_networks.forget(f"env{head.pk}")


def check_acting_on(reservation):
    """A machine alone is not ended, canceled or extended: its head acts for all."""
    if reservation.head_id is not None:
        raise Conflict(
            f"reservation {reservation.pk} is machine {reservation.hostname} of environment reservation "
            f"{reservation.head_id}: act on that one"
        )
