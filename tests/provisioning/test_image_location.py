"""An image variant's http(s):// location is checked by the outbound policy when it is saved,
so an internal address is refused on the form, not first in a staging job."""

import pytest
from django.core.exceptions import ValidationError

from provisioning import services


def add(image, location):
    return services.add_variant(image, actor="test", hypervisor_type="kvm", format="qcow2", location=location)


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.1:8000/a.qcow2",
        "http://169.254.169.254/a.qcow2",
        "https://images.internal/a.qcow2",
        "http://10.1.2.3/a.qcow2",
    ],
)
def test_it_refuses_an_internal_location_on_its_field(image, location, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []
    with pytest.raises(ValidationError) as refused:
        add(image, location)
    assert "VCLMGR_OUTBOUND_ALLOW names exceptions" in refused.value.message_dict["location"][0]


def test_an_allow_listed_network_and_a_local_path_are_accepted(image, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["10.1.0.0/16"]
    assert add(image, "http://10.1.2.3/a.qcow2").location == "http://10.1.2.3/a.qcow2"
    services.delete_variant(image.variants.get(hypervisor_type="kvm"), actor="test")
    assert add(image, "/var/lib/images/a.qcow2").location == "/var/lib/images/a.qcow2"
