"""Images for tests, made as the product makes them (provisioning's services): an image with one
variant, simulated or a file of its own. Each test names the fields it is about; the rest are
the services' defaults."""

import hashlib


def sim_image(name, *, location=None, size_gib=2, actor="test", **fields):
    """``name`` with one simulated variant (at ``sim://library/<name>`` unless ``location``)."""
    from provisioning import services

    image = services.create_image(actor=actor, name=name, **fields)
    services.add_variant(
        image,
        actor=actor,
        hypervisor_type="sim",
        format="sim",
        location=location or f"sim://library/{name}",
        checksum="",
        size_gib=size_gib,
    )
    return image


def small_image(name, location, *, actor="test"):
    """``name``: a small Debian (1 vCPU, 512 MiB, 5 GiB) with one simulated variant of 1 GiB at
    ``location``, for tests and benchmarks about many requests rather than about the image."""
    return sim_image(
        name,
        actor=actor,
        location=location,
        size_gib=1,
        os="Debian",
        min_memory_mib=256,
        default_vcpus=1,
        default_memory_mib=512,
        default_disk_gib=5,
    )


def file_image(path, content, name, *, variant, **fields):
    """``name`` with one variant that is the file ``path``, written with ``content`` (its
    checksum is the content's); ``variant``: the variant's other fields (its hypervisor type,
    format, size)."""
    from provisioning import services

    path.write_bytes(content)
    image = services.create_image(actor="test", name=name, **fields)
    services.add_variant(
        image,
        actor="test",
        location=str(path),
        checksum="sha256:" + hashlib.sha256(content).hexdigest(),
        **variant,
    )
    return image


def image_maintainer(group, username="maya"):
    """``username``, an image maintainer (the ``image-maintainer`` role) of ``group``."""
    from django.contrib.auth import get_user_model

    from accounts import access

    user = get_user_model().objects.create_user(username)
    access.set_roles(user, ["image-maintainer"], actor="test")
    user.groups.add(group)
    return user
