"""An image variant's guest login (VMware guest operations): written through the page, the API
and the admin, stored encrypted, never shown back, masked in the change log."""

import pytest

from core.models import ObjectChange
from drivers import registry as drivers
from provisioning import services
from provisioning.models import ImageVariant

SECRET = "svc-Pa55-word-'quoted' $x"  # noqa: S105 (made up here)
OTHER = "another-made-up-one"  # noqa: S105
VC_SECRET = "vc-made-up"  # noqa: S105
VMDK = {"hypervisor_type": "vmware", "format": "vmdk", "location": "/srv/images/debian-12.vmdk", "size_gib": 2}


def assert_never_shown(text):
    assert SECRET not in text


def test_the_page_takes_a_guest_login_and_never_shows_the_password(client, admin_user, image):
    client.force_login(admin_user)

    response = client.post(
        f"/vms/images/{image.pk}/variants/", {**VMDK, "guest_username": "svc", "guest_password": SECRET}
    )

    assert response.status_code == 302
    variant = image.variants.get(hypervisor_type="vmware")
    assert variant.guest_login() == {"username": "svc", "password": SECRET}
    assert SECRET not in variant.encrypted_guest_password
    page = client.get(f"/vms/images/{image.pk}/").content.decode()
    assert 'name="guest_password"' in page and 'type="password"' in page
    assert_never_shown(page)
    assert_never_shown(repr(list(ObjectChange.objects.values())))
    assert ObjectChange.objects.filter(object_id=str(variant.pk), changes__guest_password=["***", "***"]).exists()


def test_the_api_takes_the_password_write_only(admin_user, api, image):
    client = api(admin_user)

    made = client.post(
        "/api/v1/image-variants/",
        {"image": image.pk, **VMDK, "guest_username": "svc", "guest_password": SECRET},
        format="json",
    )

    assert made.status_code == 201, made.content
    assert made.json()["has_guest_password"] is True and "guest_password" not in made.json()
    assert_never_shown(made.content.decode())
    listed = client.get("/api/v1/image-variants/").content.decode()
    assert_never_shown(listed) and "svc" in listed
    assert ImageVariant.objects.get(pk=made.json()["id"]).guest_login()["password"] == SECRET


def test_the_admin_shows_whether_a_password_is_set_but_never_which(client, admin_user, image):
    services.add_variant(image, actor="test", guest_username="svc", guest_password=SECRET, **VMDK)
    client.force_login(admin_user)

    page = client.get(f"/admin/vms/image/{image.pk}/change/").content.decode()

    assert page.count('name="variants-') > 0 and "guest password set" in page.lower()
    assert_never_shown(page)


def test_set_guest_login_keeps_replaces_and_removes_the_password(image):
    variant = services.add_variant(image, actor="test", guest_username="svc", guest_password=SECRET, **VMDK)

    services.set_guest_login(variant, actor="test", username="svc2")  # password None: kept
    assert ImageVariant.objects.get(pk=variant.pk).guest_login() == {"username": "svc2", "password": SECRET}
    services.set_guest_login(variant, actor="test", username="svc2", password=OTHER)
    assert ImageVariant.objects.get(pk=variant.pk).guest_login()["password"] == OTHER
    services.set_guest_login(variant, actor="test", username="")
    fresh = ImageVariant.objects.get(pk=variant.pk)
    assert fresh.guest_login() is None and not fresh.has_guest_password
    assert_never_shown(repr(list(ObjectChange.objects.values())))


def test_a_variant_without_a_password_cannot_get_a_user_alone(image):
    variant = services.add_variant(image, actor="test", **VMDK)

    with pytest.raises(Exception, match="both a user and a password"):
        services.set_guest_login(variant, actor="test", username="svc")


def test_the_driver_gets_the_login_only_when_asked_for_a_guest(make_host, image):
    from inventory import services as inventory

    credential = inventory.create_credential(
        actor="test", name="vc", username="administrator", secret=VC_SECRET, endpoints=["https://vc.example.org/sdk"]
    )
    host = make_host("esx-1", driver="vmware", uri="https://vc.example.org/sdk?host=esx-1", credential=credential)
    login = {"username": "svc", "password": SECRET}

    assert "guest" not in drivers.driver_for(host).credentials
    with_guest = drivers.driver_for(host, guest=login)
    assert with_guest.credentials == {"username": "administrator", "password": VC_SECRET, "guest": login}
    assert_never_shown(repr(with_guest))


def test_the_admin_inline_form_keeps_a_blank_password_and_clears_it_with_the_user(image):
    from provisioning.admin import ImageVariantInlineForm

    variant = services.add_variant(image, actor="test", guest_username="svc", guest_password=SECRET, **VMDK)
    fields = {**VMDK, "checksum": ""}

    kept = ImageVariantInlineForm({**fields, "guest_username": "svc2", "guest_password": ""}, instance=variant)
    assert kept.is_valid(), kept.errors
    kept.save()
    assert ImageVariant.objects.get(pk=variant.pk).guest_login() == {"username": "svc2", "password": SECRET}
    cleared = ImageVariantInlineForm({**fields, "guest_username": ""}, instance=ImageVariant.objects.get(pk=variant.pk))
    assert cleared.is_valid(), cleared.errors
    cleared.save()
    assert not ImageVariant.objects.get(pk=variant.pk).has_guest_password
    half = ImageVariantInlineForm({**fields, "guest_username": "svc"}, instance=ImageVariant.objects.get(pk=variant.pk))
    assert not half.is_valid() and "both a user and a password" in str(half.errors)
