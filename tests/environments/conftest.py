"""Fixtures for environment templates: a public image, a private one, and a template builder."""

import pytest

from environments import services
from tests import images


@pytest.fixture
def debian(db):
    return images.sim_image("debian-12", os="Debian 12", min_memory_mib=256, default_memory_mib=512, default_disk_gib=5)


@pytest.fixture
def router_image(db):
    return images.sim_image("vyos", os="VyOS", default_vcpus=2, default_memory_mib=1024, default_disk_gib=2)


def member(name, image, *networks, entry=False, **fields):
    return {"name": name, "image": image, "networks": list(networks), "entry": entry, **fields}


@pytest.fixture
def make_template():
    """``make_template(owner, members, networks=(), name=...)`` through the service."""
    numbers = iter(range(1, 1000))

    def make(owner, members, networks=(), name=None, **fields):
        name = name or f"env-{next(numbers)}"
        return services.create_template(actor=owner, name=name, members=members, networks=networks, **fields)

    return make


@pytest.fixture
def netlab(alice, debian, router_image, make_template):
    """Alice's networking course lab: a router on two networks, a client on each."""
    return make_template(
        alice,
        [
            member("router", router_image, "left", "right", entry=True),
            member("client-a", debian, "left"),
            member("client-b", debian, "right", count=2),
        ],
        [{"name": "left", "cidr": "192.168.10.0/24"}, {"name": "right", "cidr": ""}],
        name="netlab",
        description="A router between two client networks.",
    )


@pytest.fixture
def trio(alice, debian, router_image, make_template):
    """Alice's router and two clients on one network: the smallest environment of two images."""
    return make_template(
        alice,
        [
            member("router", router_image, "inside", entry=True),
            member("client", debian, "inside"),
            member("server", debian, "inside"),
        ],
        [{"name": "inside", "cidr": "192.168.30.0/24"}],
        name="trio",
    )
