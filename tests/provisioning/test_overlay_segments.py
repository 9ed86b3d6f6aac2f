"""Segments of an overlay: each network spread over its hosts takes one no live network of that
overlay has, even when another environment takes the free one at the same moment."""

import pytest
from django.db import IntegrityError, transaction

from provisioning import private_networks
from provisioning.models import PrivateNetwork


@pytest.fixture
def overlay_hosts(make_host):
    return [make_host(f"ovl-{i}", overlay="lab-ovl") for i in range(2)]


def spread(key, hosts):
    return private_networks.record(key, "lan", hosts, "192.168.10.0/24", ["a", "b"])


def test_each_spread_network_gets_its_own_segment_and_one_home(overlay_hosts):
    first, second = spread("env1-lan", overlay_hosts), spread("env2-lan", overlay_hosts[::-1])
    assert {n.segment for n in first} == {1} and {n.segment for n in second} == {2}
    assert [n.home for n in first] == [True, False] and second[0].host == overlay_hosts[1]
    PrivateNetwork.objects.filter(key="env1-lan").update(removed="2026-01-01T00:00Z")
    assert {n.segment for n in spread("env3-lan", overlay_hosts)} == {1}  # free again


def test_two_live_networks_never_share_a_segment(overlay_hosts):
    spread("env1-lan", overlay_hosts)
    with pytest.raises(IntegrityError), transaction.atomic():
        PrivateNetwork.objects.create(
            key="env9-lan", name="lan", host=overlay_hosts[0], cidr="10.0.0.0/24", overlay="lab-ovl", segment=1
        )


def test_a_segment_taken_meanwhile_is_passed_over(overlay_hosts, monkeypatch):
    spread("env1-lan", overlay_hosts)
    found = iter([1])  # what a query made just before env1's commit would have answered
    real = private_networks.free_segment
    monkeypatch.setattr(private_networks, "free_segment", lambda overlay: next(found, None) or real(overlay))
    assert {n.segment for n in spread("env2-lan", overlay_hosts)} == {2}


def test_a_network_recorded_twice_is_an_error_not_a_full_overlay(overlay_hosts):
    spread("env1-lan", overlay_hosts)
    with pytest.raises(IntegrityError), transaction.atomic():
        spread("env1-lan", overlay_hosts)  # the same key on the same hosts: said at once, not retried
