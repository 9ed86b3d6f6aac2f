"""An image's own cloud-config is refused when saved if it could not be merged into a seed: an
alias (a few bytes standing for billions of values) or a document that is not a cloud-config."""

import pytest
from django.core.exceptions import ValidationError

from drivers import cloudinit
from provisioning import services

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnlyxxxxxxxxxxxxxxxxxxxxxxxxx alice@laptop"
BOMB = (
    "#cloud-config\n"
    + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]\n" for n in range(1, 10))
)


def test_it_refuses_an_alias_in_the_images_user_data_naming_the_field(image):
    with pytest.raises(ValidationError) as refused:
        services.update_image(image, actor="test", user_data=BOMB)
    assert refused.value.message_dict["user_data"] == [
        "line 3: the YAML refers to anchor a0 (*a0); aliases are not accepted: write the value out"
    ]
    image.refresh_from_db()
    assert image.user_data == ""


def test_it_refuses_a_small_alias_and_a_document_that_is_not_a_cloud_config(image):
    with pytest.raises(ValidationError, match="refers to anchor k"):
        services.update_image(image, actor="test", user_data="#cloud-config\nx: &k [1]\ny: *k\n")
    with pytest.raises(ValidationError, match="only a #cloud-config document"):
        services.update_image(image, actor="test", user_data="#!/bin/sh\necho hi\n")
    services.update_image(image, actor="test", user_data="#cloud-config\npackages: [htop]\n")


def test_a_seed_never_expands_an_alias_saved_before_the_check(image):
    login = cloudinit.GuestLogin(
        instance_id="i-1", hostname="vm-1", login="alice", ssh_keys=(KEY,), image_user_data=BOMB
    )
    with pytest.raises(cloudinit.SeedError, match="refers to anchor a0"):
        cloudinit.user_data(login)
