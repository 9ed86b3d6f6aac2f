"""A libvirt URI can never make a worker run a program or open a file it names.

``qemu+ext:///system?command=PROGRAM`` makes libvirt run PROGRAM; the other parameters below
name files or programs too. Each is refused wherever a URI comes in — a single create, the API,
the bulk import, discovery — and again by the driver itself right before it connects. The
program is a real script that would leave a mark: the tests check it never ran.
"""

import pytest
from django.core.exceptions import ValidationError

from drivers import registry
from inventory import services
from inventory.discovery import services as discovery
from inventory.validators import uri_errors
from tests.inventory.conftest import TEST, host_row, import_csv
from tests.inventory.test_import import assert_refused, written


@pytest.fixture
def program(tmp_path):
    """An executable that leaves ``ran`` behind if anything ever runs it."""
    mark = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {mark}\n")
    script.chmod(0o755)
    yield script
    assert not mark.exists(), "a libvirt URI ran a program"


def dangerous(program):
    return [
        f"qemu+ext:///system?command={program}",
        f"qemu+ssh://root@127.0.0.1/system?command={program}",
        f"qemu+ssh://root@127.0.0.1/system?netcat={program}",
        "qemu+ssh://root@127.0.0.1/system?keyfile=/root/.ssh/id_ed25519",
        "qemu:///system?socket=/tmp/not-a-libvirtd",
        "qemu+unix:///system",
        "qemu+libssh2://root@127.0.0.1/system?known_hosts=/tmp/k",
    ]


def test_the_validator_refuses_each_dangerous_uri_and_names_why(program):
    for uri in dangerous(program):
        problem = uri_errors(uri, "libvirt")
        assert problem and ("transport" in problem or "parameter" in problem), uri


@pytest.mark.parametrize(
    "uri",
    [
        "qemu+ssh://root@kvm01/system",
        "qemu+tls://kvm01/system",
        "qemu+tcp://kvm01/system",
        "qemu:///system",
        "qemu+ssh://root@kvm01/system?no_verify=1&sshauth=privkey",
        "test:///default",
    ],
)
def test_ordinary_uris_stay_accepted(uri):
    assert uri_errors(uri, "libvirt") is None


def test_a_socket_is_accepted_only_when_the_operator_listed_it(settings):
    uri = "qemu:///system?socket=/run/private/libvirt-sock"
    assert "VCLMGR_LIBVIRT_SOCKETS" in uri_errors(uri, "libvirt")
    settings.VCLMGR_LIBVIRT_SOCKETS = ["/run/private/libvirt-sock"]
    assert uri_errors(uri, "libvirt") is None
    assert uri_errors("qemu+ssh://root@kvm01/system?socket=/run/private/libvirt-sock", "libvirt")


def test_create_refuses_them_and_writes_nothing(db, program):
    before = written()
    for uri in dangerous(program):
        with pytest.raises(ValidationError) as refused:
            services.create_hypervisor(
                actor=TEST,
                name="kvm01",
                address="127.0.0.1",
                driver="libvirt",
                uri=uri,
                cpus=4,
                memory_mib=4096,
                disk_gib=40,
            )
        assert "uri" in refused.value.message_dict
    assert written() == before


def test_the_api_refuses_them(db, api, admin_user, program):
    client = api(admin_user)
    for uri in dangerous(program):
        response = client.post(
            "/api/v1/hypervisors/",
            {
                "name": "kvm01",
                "address": "127.0.0.1",
                "driver": "libvirt",
                "uri": uri,
                "cpus": 4,
                "memory_mib": 4096,
                "disk_gib": 40,
            },
            format="json",
        )
        assert response.status_code == 400, uri
        assert "uri" in response.json()["error"]["fields"]


def test_the_import_refuses_the_whole_file(db, program):
    rows = [host_row(1), host_row(2, uri=f"qemu+ext:///system?command={program}")]
    assert_refused(lambda: import_csv(rows), "transport 'ext' is not allowed")


def test_discovery_refuses_them_before_connecting(db, program):
    for uri in dangerous(program):
        with pytest.raises(discovery.DiscoveryError):
            discovery.discover("libvirt", [uri], actor=TEST)
    assert written() == (0, 0, 0)


def test_the_driver_itself_refuses_to_connect(program):
    driver = registry.get_driver("libvirt", f"qemu+ext:///system?command={program}")
    with pytest.raises(registry.Invalid, match="transport 'ext'"):
        driver.facts()
