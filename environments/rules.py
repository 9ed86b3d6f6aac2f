"""The rules of a template that span its rows, checked on plain data before anything is written.

``check`` takes a template's members and networks as dicts (what the API, the CLI's YAML and
the admin all give) and answers them completed (every size resolved from the image's defaults,
every blank range picked) or raises one ``ValidationError`` naming each broken rule (the site's
cap on machines a template holds, ``ENVIRONMENT_MAX_MACHINES``, among them), keyed by
``members``, ``networks`` or the field at fault, so every surface shows the same words.
"""

import ipaddress
import itertools

from django.conf import settings
from django.core.exceptions import ValidationError

from accounts import access
from environments.models import DNS_LABEL, MAX_COUNT, MAX_DISK_GIB, MAX_MEMORY_MIB, MAX_VCPUS, hostnames
from provisioning import services as vms
from provisioning.models import Image, ImageRevision

#: The private ranges of RFC 1918: a template's networks live inside one of them.
PRIVATE = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
PREFIXES = range(16, 30)  # /16 … /29
#: Where blank ranges are picked from: /24s of 192.168.0.0/16 first, larger ones from 10.0.0.0/8.
PICK_FROM = {24: ipaddress.IPv4Network("192.168.0.0/16")}
PICK_LARGE = ipaddress.IPv4Network("10.0.0.0/8")


def holds(network):
    """Machines a range holds: its addresses less the network, broadcast and gateway ones."""
    return network.num_addresses - 3


def check(owner, members, networks):
    """``(members, networks)`` completed, or ValidationError listing every broken rule.

    ``members``: dicts of name, image (an ``Image``, its id or its name), revision (its
    number, or None: production), count, vcpus, memory_mib,
    disk_gib (None: the image's default), entry, networks (names); ``networks``: dicts of
    name and cidr (blank: picked). ``owner``: whose images the members may use (None: any)."""
    errors = {}
    networks = [dict(n, name=(n.get("name") or "").strip(), cidr=(n.get("cidr") or "").strip()) for n in networks]
    members = [_member(m) for m in members]
    _names(errors, "networks", [n["name"] for n in networks], "network")
    _say_long(errors, [n["name"] for n in networks])
    _names(errors, "members", [m["name"] for m in members], "member")
    _hostnames(errors, members)
    _total(errors, members)
    _images(errors, owner, members)
    _entry(errors, members)
    _attachments(errors, members, {n["name"] for n in networks})
    _ranges(errors, networks, members)
    _anti_affinity(errors, members)
    if not members:
        errors.setdefault("members", []).append("a template needs at least one member")
    if errors:
        raise ValidationError(errors)
    return members, networks


def _member(raw):
    member = {
        "name": (raw.get("name") or "").strip(),
        "image": raw.get("image"),
        "revision": raw.get("revision"),
        "count": raw.get("count") or 1,
        "vcpus": raw.get("vcpus"),
        "memory_mib": raw.get("memory_mib"),
        "disk_gib": raw.get("disk_gib"),
        "entry": bool(raw.get("entry", False)),
        "networks": list(dict.fromkeys(raw.get("networks") or ())),
    }
    return member


def _say(errors, key, message):
    errors.setdefault(key, []).append(message)


#: A network's name goes into its key on a host after its environment's (``env<id>-<name>``,
#: ``run<id>-<name>``), which is at most 63 characters.
MAX_NETWORK_NAME = 40


def _say_long(errors, names):
    for name in names:
        if len(name) > MAX_NETWORK_NAME:
            _say(errors, "networks", f"network {name[:20]}…: at most {MAX_NETWORK_NAME} characters")


def _names(errors, key, names, noun):
    for name in names:
        try:
            DNS_LABEL(name)
        except ValidationError:
            _say(errors, key, f"{noun} {name!r}: {DNS_LABEL.message}")
    for name in sorted({n for n in names if names.count(n) > 1}):
        _say(errors, key, f"two {noun}s are named {name}")


def _hostnames(errors, members):
    seen = {}
    for member in members:
        count = member["count"]
        if not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            _say(errors, "members", f"member {member['name']}: count must be 1 to {MAX_COUNT}")
            member["count"] = 1
        for host in hostnames(member["name"], member["count"]):
            if len(host) > 63:
                _say(errors, "members", f"member {member['name']}: hostname {host} is longer than 63 characters")
            elif host in seen and seen[host] != member["name"]:
                _say(errors, "members", f"hostname {host} is made by both member {seen[host]} and {member['name']}")
            seen.setdefault(host, member["name"])


def _total(errors, members):
    total, cap = sum(m["count"] for m in members), settings.ENVIRONMENT_MAX_MACHINES
    if total > cap:
        _say(errors, "members", f"{total} machines in all; a template holds at most {cap} (ENVIRONMENT_MAX_MACHINES)")


def _images(errors, owner, members):
    usable = Image.objects.all() if owner is None else Image.objects.visible_to(owner)
    for member in members:
        image = member["image"]
        pk = getattr(image, "pk", image)
        if isinstance(pk, str):  # a name (the CLI's YAML)
            found = usable.filter(name=pk).first()
        else:
            found = usable.filter(pk=pk).first() if isinstance(pk, int) else None
        if found is None:
            _say(errors, "members", f"member {member['name']}: no such image, or its owner may not use it")
            continue
        member["image"] = found
        if not found.active:
            _say(errors, "members", f"member {member['name']}: image {found.name} is inactive")
        _revision(errors, owner, member, found)
        size = vms.size_for(found, member["vcpus"], member["memory_mib"], member["disk_gib"])
        member.update(size)
        for field, low, high in (
            ("vcpus", found.min_vcpus, MAX_VCPUS),
            ("memory_mib", found.min_memory_mib, MAX_MEMORY_MIB),
            ("disk_gib", found.min_disk_gib, MAX_DISK_GIB),
        ):
            if not isinstance(size[field], int) or not low <= size[field] <= high:
                _say(errors, "members", f"member {member['name']}: {field} must be {low} to {high} for {found.name}")


def _revision(errors, owner, member, image):
    """A pinned revision: the image's own, not retired, and pinned (when not production) only by
    whoever maintains the image, as a reservation pins one only to test it. It, or the
    production revision, has a disk for some hypervisor."""
    given = member["revision"]
    if given in (None, ""):
        member["revision"] = None
        if not image.variants.production().exists():
            _say(errors, "members", f"member {member['name']}: image {image.name} has no variant for any hypervisor")
        return
    number = getattr(given, "number", given)
    revision = image.revisions.filter(number=number).first() if isinstance(number, int) else None
    if revision is None:
        _say(errors, "members", f"member {member['name']}: image {image.name} has no revision {given}")
        return
    member["revision"] = revision
    if revision.state == ImageRevision.State.RETIRED:
        _say(errors, "members", f"member {member['name']}: revision {revision.number} of {image.name} is retired")
    elif revision.state != ImageRevision.State.PRODUCTION and not (
        owner is None or access.can_maintain_image(owner, image)
    ):
        words = f"only a maintainer of {image.name} pins a revision under test"
        _say(errors, "members", f"member {member['name']}: {words}")
    elif not revision.variants.exists():
        _say(errors, "members", f"member {member['name']}: revision {revision.number} of {image.name} has no variant")


def _entry(errors, members):
    entries = [m for m in members if m["entry"]]
    if members and not entries:
        _say(errors, "members", "no member is the entry point: mark exactly one (of count 1)")
    elif len(entries) > 1:
        _say(errors, "members", f"{len(entries)} entry points ({', '.join(m['name'] for m in entries)}): mark one")
    for member in entries:
        if member["count"] != 1:
            _say(errors, "members", f"member {member['name']}: the entry point is one machine (count 1)")


def _attachments(errors, members, known):
    machines = sum(m["count"] for m in members)
    for member in members:
        for name in member["networks"]:
            if name not in known:
                _say(errors, "members", f"member {member['name']}: no network named {name}")
        if machines > 1 and not member["networks"]:
            _say(errors, "members", f"member {member['name']} is on no network: with several machines each needs one")


def _ranges(errors, networks, members):
    attached = {n["name"]: sum(m["count"] for m in members if n["name"] in m["networks"]) for n in networks}
    parsed = {}
    for net in networks:
        if not net["cidr"]:
            continue
        try:
            parsed[net["name"]] = _range(net["cidr"])
        except ValueError as exc:
            _say(errors, "networks", f"network {net['name']}: {exc}")
    for (a, na), (b, nb) in itertools.combinations(parsed.items(), 2):
        if na.overlaps(nb):
            _say(errors, "networks", f"networks {a} ({na}) and {b} ({nb}) overlap")
    for net in networks:
        if not net["cidr"]:
            picked = pick(attached[net["name"]], list(parsed.values()))
            if picked is None:
                _say(errors, "networks", f"network {net['name']}: no free private range holds its machines")
                continue
            parsed[net["name"]] = picked
            net["cidr"] = str(picked)
        elif net["name"] not in parsed:
            continue
        if attached[net["name"]] > holds(parsed[net["name"]]):
            rng = parsed[net["name"]]
            _say(
                errors,
                "networks",
                f"network {net['name']} ({rng}) holds {holds(rng)} machines; {attached[net['name']]} are attached",
            )


def _anti_affinity(errors, members):
    """Machines joined through networks share a host (placement's ``together``), and machines of
    an image with an anti-affinity group never do: at most one such machine per joined set."""
    parent = {m["name"]: m["name"] for m in members}

    def root(name):
        while parent[name] != name:
            name = parent[name]
        return name

    first_on = {}
    for member in members:
        for network in member["networks"]:
            other = first_on.setdefault(network, member["name"])
            parent[root(member["name"])] = root(other)
    joined = {}
    for member in members:
        joined.setdefault(root(member["name"]), []).append(member)
    for group in joined.values():
        if sum(m["count"] for m in group) < 2:
            continue
        apart = [m for m in group if isinstance(m["image"], Image) and m["image"].anti_affinity]
        if sum(m["count"] for m in apart) > 1:
            names = ", ".join(f"{m['name']} ({m['image'].name}: {m['image'].anti_affinity})" for m in apart)
            _say(
                errors,
                "members",
                f"members {names} are joined through networks, so they share a host, but their images' "
                "anti-affinity groups keep them on different hosts: at most one such machine per joined set",
            )


def _range(text):
    try:
        network = ipaddress.IPv4Network(text, strict=True)
    except ValueError:
        raise ValueError(f"{text} is not an IPv4 range such as 192.168.10.0/24 (host bits clear)") from None
    if not any(network.subnet_of(p) for p in PRIVATE):
        raise ValueError(f"{text} is not private (10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16)")
    if network.prefixlen not in PREFIXES:
        raise ValueError(f"{text}: the prefix must be /16 to /29")
    return network


def pick(machines, taken):
    """The first free range that holds ``machines``: a /24 of 192.168.0.0/16 when that is enough,
    else the smallest prefix that is, from 10.0.0.0/8; None when all are taken."""
    prefix = max((p for p in PREFIXES if holds(ipaddress.IPv4Network(f"10.0.0.0/{p}")) >= machines), default=None)
    if prefix is None:
        return None
    pools = [PICK_FROM[24], PICK_LARGE] if prefix >= 24 else [PICK_LARGE]
    for pool in pools:
        for candidate in pool.subnets(new_prefix=min(prefix, 24)):
            if not any(candidate.overlaps(t) for t in taken):
                return candidate
    return None
