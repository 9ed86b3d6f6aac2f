"""Every write of environment templates, and what a template becomes: its machines and its gang.

Who may do what is the images' rule, asked of ``accounts.access`` here so that pages, API, CLI
and admin cannot differ: any signed-in user writes templates of their own (restricted, shared
with no group: theirs alone); the owner, an image maintainer of the template's groups and
administrators change or delete it; sharing with groups is a maintainer's for their own groups
(``access.check_image_sharing``); only administrators make one public. A template reaches
its audience only if they may use each of its images (``_check_audience``): sharing it,
publishing it and changing the members of a shared one are refused otherwise.

``gang_for`` is where a template meets placement: one ``placement.Request`` per machine, built
as a reservation's is (``provisioning.services.demand_for``), and the machines joined through
private networks in one ``together`` set, because there is no overlay between hosts.
"""

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from accounts import access
from core import changelog, events
from core.errors import InUse
from environments import rules
from environments.models import EnvironmentTemplate, Member, Network
from placement.gang import Gang
from provisioning import services as vms
from provisioning.models import Image, ImageRevision

FIELDS = ("name", "description", "visibility", "active")


def visible_templates(user):
    return EnvironmentTemplate.objects.visible_to(user)


def _check_fields(actor, fields, was=None):
    """Unknown fields refused; making a template public is an administrator's (``was``: its
    visibility before, so that resending ``public`` unchanged asks for nothing)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in sorted(unknown)})
    public = EnvironmentTemplate.Visibility.PUBLIC
    if fields.get("visibility") == public and was != public and not access.is_admin(actor):
        raise PermissionDenied("only administrators make a template public")


def _audience_sees(image, revision, group):
    """May the members of ``group`` (None: every user) use ``image`` at ``revision``? An image
    reaches a group when it is active and public or shared with that group; a revision under
    test is its maintainers' alone."""
    if revision is not None and revision.state != ImageRevision.State.PRODUCTION:
        return False
    if not image.active:
        return False
    if image.visibility == Image.Visibility.PUBLIC:
        return True
    return group is not None and image.groups.filter(pk=getattr(group, "pk", group)).exists()


def _check_audience(members, public, groups):
    """Refuse (ValidationError) a template whose audience (every user when ``public``, else the
    members of ``groups``) could not use one of its members' images: sharing the template would
    show them an image (its name, its id) they may not see."""
    audience = [None] if public else list(groups)
    hidden = sorted(
        {m["image"].name for m in members if any(not _audience_sees(m["image"], m["revision"], g) for g in audience)}
    )
    if hidden:
        who = "every user" if public else "its groups"
        words = f"{who} may not use image{'s' if len(hidden) > 1 else ''} {', '.join(hidden)}"
        raise ValidationError({"members": [f"{words}: share or publish the image (a production revision) first"]})


def _check_owner(actor, template):
    """The image rule (``access.check_image_ownership``), said of a template."""
    try:
        access.check_image_ownership(actor, template)
    except PermissionDenied:
        words = "only its owner, an image maintainer of its groups or an administrator may change it"
        raise PermissionDenied(words) from None


def may_change(user, template):
    """May ``user`` change or delete ``template`` (for pages: the services check again)?"""
    try:
        _check_owner(user, template)
    except PermissionDenied:
        return False
    return True


def _validated(template):
    try:
        template.full_clean(validate_unique=True)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from None


def create_template(*, actor, members, networks=(), reason="", **fields):
    """A new template owned by ``actor`` (members and networks: as ``rules.check`` takes them)."""
    if actor is None or not getattr(actor, "is_authenticated", False):
        raise PermissionDenied("sign in to write a template")
    _check_fields(actor, fields)
    template = EnvironmentTemplate(owner=actor, **fields)
    _validated(template)
    members, networks = rules.check(actor, members, networks)
    if template.visibility == EnvironmentTemplate.Visibility.PUBLIC:
        _check_audience(members, True, ())
    with transaction.atomic():
        template.save()
        _write_rows(template, members, networks)
        changelog.record(template, "create", actor, reason=reason)
        _emit("environment.created", template)
    return template


def update_template(template, *, actor, members=None, networks=None, reason="", **fields):
    """Change ``template``'s fields; ``members`` and ``networks`` given: they replace its own
    (both checked together, so the one not given is kept as it is)."""
    _check_owner(actor, template)
    _check_fields(actor, fields, was=template.visibility)
    before = {name: getattr(template, name) for name in fields}
    for name, value in fields.items():
        setattr(template, name, value)
    _validated(template)
    rows = None
    if members is not None or networks is not None:
        kept_members, kept_networks = as_specs(template)
        given_members = kept_members if members is None else members
        given_networks = kept_networks if networks is None else networks
        # the owner's images (an owner since deleted: the images of whoever changes it)
        rows = rules.check(template.owner or actor, given_members, given_networks)
    public = template.visibility == EnvironmentTemplate.Visibility.PUBLIC
    if public or rows is not None:
        audience = [] if public else list(template.groups.all())
        _check_audience(rows[0] if rows is not None else _kept_rows(template), public, audience)
    with transaction.atomic():
        template.save()
        if rows is not None:
            template.members.all().delete()
            template.networks.all().delete()
            _write_rows(template, *rows)
        changes = changelog.diff(before, fields, list(fields))
        if rows is not None:
            changes["members"] = [m["name"] for m in rows[0]]
            changes["networks"] = [n["name"] for n in rows[1]]
        changelog.record(template, "update", actor, changes, reason)
        _emit("environment.updated", template)
    return template


def delete_template(template, *, actor, reason=""):
    """Delete ``template``; one that reservations, blocks, classes or runs name (their history
    keeps it) is refused with ``InUse``: switch it off (``active``) instead."""
    _check_owner(actor, template)
    with transaction.atomic():
        _refuse_in_use(template)
        changelog.record(template, "delete", actor, reason=reason)
        _emit("environment.deleted", template)
        template.delete()


def _refuse_in_use(template):
    EnvironmentTemplate.objects.select_for_update().filter(pk=template.pk).first()  # none made meanwhile
    held = {
        "reservations": template.reservations.filter(head=None).count(),
        "blocks": template.blocks.count(),
        "classes": template.classes.count(),
        "runs": template.runs.count(),
    }
    used = ", ".join(f"{count} {what}" for what, count in held.items() if count)
    if used:
        raise InUse(f"environment template {template.name} is in use by {used}: switch it off (inactive) instead")


def share_template(template, groups, *, actor, reason=""):
    """Restrict ``template`` to ``groups``, as an image is shared (``provisioning.owned.share``):
    a maintainer gives only their own groups, the template's other groups kept; none: back to
    its owner (and administrators) alone."""
    chosen = access.shared_groups(actor, template, groups)
    _check_audience(_kept_rows(template), False, chosen)
    with transaction.atomic():
        template.visibility = EnvironmentTemplate.Visibility.RESTRICTED
        template.save(update_fields=["visibility", "updated"])
        template.groups.set(chosen)
        changelog.record(template, "update", actor, {"groups": chosen}, reason or f"shared with {len(chosen)} groups")
        _emit("environment.updated", template)
    return template


def check_audience(template, *, public, groups=()):
    """Refuse (ValidationError) showing ``template`` to every user (``public``) or to the
    members of ``groups``, when one of its images is not theirs to use (for forms that check
    before they save; the services check again)."""
    _check_audience(_kept_rows(template), public, groups)


def _kept_rows(template):
    """``template``'s members as ``_check_audience`` takes them."""
    return [{"image": m.image, "revision": m.revision} for m in template.members.select_related("image", "revision")]


def _emit(kind, template):
    """The change, for the administrators' live pages (written in the change's transaction)."""
    data = {"id": template.pk, "name": template.name, "owner": template.owner_id, "visibility": template.visibility}
    events.emit(kind, data, ["admin"])


def _write_rows(template, members, networks):
    by_name = {}
    for spec in networks:
        by_name[spec["name"]] = Network.objects.create(template=template, name=spec["name"], cidr=spec["cidr"])
    for spec in members:
        member = Member.objects.create(
            template=template,
            name=spec["name"],
            image=spec["image"],
            revision=spec["revision"],
            count=spec["count"],
            vcpus=spec["vcpus"],
            memory_mib=spec["memory_mib"],
            disk_gib=spec["disk_gib"],
            entry=spec["entry"],
        )
        member.networks.set([by_name[name] for name in spec["networks"]])


def as_specs(template):
    """``template``'s members and networks as ``rules.check`` takes them (what an update keeps)."""
    networks = [{"name": n.name, "cidr": n.cidr} for n in template.networks.all()]
    members = [
        {
            "name": m.name,
            "image": m.image_id,
            "revision": m.revision.number if m.revision_id else None,
            "count": m.count,
            "vcpus": m.vcpus,
            "memory_mib": m.memory_mib,
            "disk_gib": m.disk_gib,
            "entry": m.entry,
            "networks": [n.name for n in m.networks.all()],
        }
        for m in template.members.select_related("image", "revision").prefetch_related("networks")
    ]
    return members, networks


@dataclass(frozen=True)
class Machine:
    """One VM of an environment: a member's machine (``name-i`` when the member has several)."""

    hostname: str
    member: str
    image: object
    revision: object  # an ImageRevision, or None: the production one when it is built
    vcpus: int
    memory_mib: int
    disk_gib: int
    networks: tuple[str, ...]
    entry: bool

    @property
    def size(self):
        return {"vcpus": self.vcpus, "memory_mib": self.memory_mib, "disk_gib": self.disk_gib}


def expand(template):
    """The machines ``template`` stands for, in member order."""
    machines = []
    for member in template.members.select_related("image", "revision").prefetch_related("networks"):
        networks = tuple(sorted(n.name for n in member.networks.all()))
        for hostname in member.hostnames():
            machines.append(
                Machine(
                    hostname=hostname,
                    member=member.name,
                    image=member.image,
                    revision=member.revision,
                    vcpus=member.vcpus,
                    memory_mib=member.memory_mib,
                    disk_gib=member.disk_gib,
                    networks=networks,
                    entry=member.entry,
                )
            )
    return machines


def counted(machines):
    """``machines`` as plain data (hostname, image id, revision id, size), to tell later whether
    a template still stands for the machines counted when something was asked of it."""
    return [
        [m.hostname, m.image.pk, getattr(m.revision, "pk", None), m.vcpus, m.memory_mib, m.disk_gib] for m in machines
    ]


def hidden_images(user, machines):
    """The ids of ``machines``' images ``user`` may not see: a template shared with them does
    not show them (pages and CLI leave their names out)."""
    ids = {m.image.pk for m in machines}
    return ids - set(Image.objects.visible_to(user).filter(pk__in=ids).values_list("pk", flat=True))


def together(machines):
    """The sets of hostnames joined through networks (the connected components of the
    machine–network graph) that hold more than one machine."""
    parent = {m.hostname: m.hostname for m in machines}

    def root(name):
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    first_on = {}
    for machine in machines:
        for network in machine.networks:
            other = first_on.setdefault(network, machine.hostname)
            parent[root(machine.hostname)] = root(other)
    components = {}
    for machine in machines:
        components.setdefault(root(machine.hostname), set()).add(machine.hostname)
    return tuple(frozenset(c) for c in components.values() if len(c) > 1)


def gang_for(template, start, end, id_prefix=""):
    """``template`` as a ``placement.Gang`` over ``[start, end)``: member ids are
    ``id_prefix + hostname``; each request is ``demand_for``'s, a reservation's own (a pinned
    revision runs on the hypervisor types it has variants for)."""
    machines = expand(template)
    purpose = f"environment {template.name}"
    requests = []
    for m in machines:
        types = vms.variant_types(m.image, m.revision.pk) if m.revision is not None else None
        demand = vms.demand_for(m.image, m.size, start=start, end=end, purpose=purpose, hypervisors=types)
        requests.append(demand.request(f"{id_prefix}{m.hostname}"))
    sets = tuple(frozenset(f"{id_prefix}{h}" for h in group) for group in together(machines))
    return Gang(members=tuple(requests), together=sets, id=f"{id_prefix}{template.name}")
