"""Images users own: visible to their owner at once, shared by a maintainer, renamed and deleted while unused."""

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied

from accounts import access
from core.errors import InUse
from provisioning import owned, services
from provisioning.models import Image
from tests.images import image_maintainer

pytestmark = pytest.mark.django_db


@pytest.fixture
def lab(db):
    return Group.objects.create(name="lab")


@pytest.fixture
def maya(lab):
    """An image maintainer of ``lab``."""
    return image_maintainer(lab)


@pytest.fixture
def mine(alice, lab):
    """Alice's capture (restricted, no group: hers only), Alice a member of ``lab``."""
    alice.groups.add(lab)
    image = services.create_image(actor=alice, name="alice-work", visibility="restricted", owner=alice)
    services.add_variant(image, actor="test", hypervisor_type="sim", format="sim", location="sim://library/alice-work")
    return image


def visible(user, image):
    return services.visible_images(user).filter(pk=image.pk).exists()


def test_an_owner_sees_their_image_and_nobody_else_but_staff_and_their_maintainers(mine, alice, bob, maya, lab):
    lab.user_set.add(bob)  # a classmate: not until shared
    assert visible(alice, mine) and not visible(bob, mine)
    assert visible(maya, mine)  # to review and share it
    assert list(owned.owned_by(alice)) == [mine] and not owned.owned_by(bob).exists()


def test_a_maintainer_of_the_owners_group_shares_it_with_that_group(mine, alice, bob, maya, lab):
    lab.user_set.add(bob)
    owned.share(mine, [lab], actor=maya)
    mine.refresh_from_db()
    assert mine.visibility == "restricted" and list(mine.groups.all()) == [lab]
    assert visible(bob, mine) and visible(alice, mine)
    owned.share(mine, [], actor=maya)  # taken back: its owner's again
    assert not visible(bob, mine) and visible(alice, mine)


def test_it_rejects_sharing_by_others_and_with_others_groups(mine, alice, bob, maya, django_user_model):
    other = Group.objects.create(name="other-course")
    with pytest.raises(PermissionDenied):
        owned.share(mine, [other], actor=maya)  # not her group
    with pytest.raises(PermissionDenied):
        owned.share(mine, [], actor=alice)  # an owner is not a maintainer
    stranger = django_user_model.objects.create_user("sam")
    access.set_roles(stranger, ["image-maintainer"], actor="test")
    stranger.groups.add(other)
    with pytest.raises(PermissionDenied):
        owned.share(mine, [other], actor=stranger)  # Alice is not in his groups
    assert not mine.groups.exists()


def test_a_maintainer_keeps_the_groups_of_others(mine, maya, lab, admin_user):
    other = Group.objects.create(name="other-course")
    owned.share(mine, [other], actor=admin_user)
    owned.share(mine, [lab], actor=maya)
    assert set(mine.groups.values_list("name", flat=True)) == {"lab", "other-course"}
    owned.share(mine, [lab], actor=admin_user)  # administrators set them all
    assert list(mine.groups.values_list("name", flat=True)) == ["lab"]


def test_an_owner_renames_and_deletes_their_unused_image(mine, alice, bob):
    with pytest.raises(PermissionDenied):
        owned.rename(mine, "bobs-now", actor=bob)
    owned.rename(mine, "alice-lab-3", actor=alice)
    assert Image.objects.get(pk=mine.pk).name == "alice-lab-3"
    with pytest.raises(PermissionDenied):
        owned.delete(mine, actor=bob)
    owned.delete(mine, actor=alice)
    assert not Image.objects.filter(pk=mine.pk).exists()


def test_an_image_in_use_is_neither_renamed_nor_deleted(sim_host, mine, alice, sync_jobs):
    vm, _ = services.request_vm(actor=alice, owner=alice, image=mine)
    sync_jobs.drain()
    with pytest.raises(InUse, match="in use by 1 VMs"):
        owned.rename(mine, "other-name", actor=alice)
    with pytest.raises(InUse):
        owned.delete(mine, actor=alice)
    assert Image.objects.get(pk=mine.pk).name == "alice-work"
    services.submit_action(vm, "destroy", actor=alice)
    sync_jobs.drain()
    owned.rename(mine, "other-name", actor=alice)  # no VM uses it any more
    with pytest.raises(InUse):  # but a destroyed VM's record still names it
        owned.delete(mine, actor=alice)


def test_an_image_is_never_shared_with_a_group_that_gives_a_role(mine, admin_user, api):
    from django.core.exceptions import ValidationError

    operator, _ = Group.objects.get_or_create(name="operator")
    with pytest.raises(ValidationError, match="operator gives a role"):
        owned.share(mine, [operator], actor=admin_user)
    refused = api(admin_user).post(f"/api/v1/images/{mine.pk}/share/", {"groups": [operator.pk]}, format="json")
    assert refused.status_code == 400 and "gives a role" in refused.content.decode()
    assert not Image.objects.get(pk=mine.pk).groups.exists()


def test_an_inactive_image_leaves_its_owners_list_and_stays_its_maintainers(mine, alice, bob, maya, lab):
    """Templates' owners see their inactive templates; images keep their rule: an inactive
    capture is no longer its owner's to build from, still its maintainers' and the staff's."""
    lab.user_set.add(bob)
    owned.share(mine, [lab], actor=maya)
    Image.objects.filter(pk=mine.pk).update(active=False)
    assert not visible(alice, mine) and not visible(bob, mine)
    assert visible(maya, mine)
