"""Platform → images → hosts: which images provide a platform, and which hosts can run them.

A platform is what images declare: their OS (``Image.os``, compared slugified: "Debian 12" is
``debian-12``) and their architecture (``Image.platform``, e.g. ``x86_64``), written
``debian-12`` or ``debian-12/x86_64``. Images are not portable across hypervisors: a host
can run an image only if the image has a variant of the host's hypervisor type (simulated
hosts too, unless told to run any image: ``registry.runs_any_image``). ``usable`` keeps the
images some online host can run, and when none is left says why, per image and hypervisor
type: "no host: 12 lack a kvm variant of debian-12".
"""

from collections import Counter

from django.utils.text import slugify

from drivers import registry
from inventory.models import Hypervisor
from provisioning import services as vms


class NoPlatform(Exception):
    """Nothing provides the platform, or no online host can run what does (the message says which)."""


def split(platform):
    os_part, _, arch = str(platform).strip().partition("/")
    return slugify(os_part), arch.strip()


def images_for(user, platform):
    """The active images ``user`` may use that provide ``platform``, by name."""
    os_slug, arch = split(platform)
    if not os_slug:
        raise NoPlatform("a platform is an OS and an optional architecture, e.g. debian-12 or debian-12/x86_64")
    images = [
        image
        for image in vms.with_production_variants(vms.visible_images(user).filter(active=True))
        if slugify(image.os) == os_slug and (not arch or image.platform == arch)
    ]
    if not images:
        raise NoPlatform(f"no image provides the platform {platform!r}")
    return images


def _runs_on(image, host):
    types = {v.hypervisor_type for v in image.variants.all()}
    return registry.serves(host.hypervisor_type, types)


def usable(images):
    """``images`` that some online host can run (in order), or NoPlatform explaining why none."""
    hosts = list(Hypervisor.objects.filter(state=Hypervisor.State.ONLINE).only("driver", "state"))
    if not hosts:
        raise NoPlatform("no host: none is online")
    fit = [image for image in images if any(_runs_on(image, host) for host in hosts)]
    if fit:
        return fit
    reasons = []
    for image in images:
        missing = Counter(host.hypervisor_type for host in hosts if not _runs_on(image, host))
        reasons += [f"{n} lack a {hv_type} variant of {image.name}" for hv_type, n in missing.most_common()]
    raise NoPlatform("no host: " + "; ".join(reasons))
