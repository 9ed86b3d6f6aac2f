"""The guest's login delivered as VMware guestinfo: what cloud-init's VMware datasource will read,
on vcsim; reseeding after a revert; and no secret in what the driver returns or logs."""

import dataclasses
import json
import logging

import pytest
import yaml

from drivers import cloudinit
from drivers.base import Conflict, Invalid, VMState
from drivers.cloudinit import GuestLogin
from drivers.vmware import guestinfo

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIVmwareKeyForTestsOnlyyyyyyyyyyyyyyyyyyyyyyyyy alice@laptop"
HASH = cloudinit.password_hash("one-time-Secret-1")
OTHER_HASH = cloudinit.password_hash("one-time-Secret-2")


def guest(**over):
    fields = {"instance_id": "i-vm-1", "hostname": "lab-1", "login": "alice", "password_hash": HASH, "ssh_keys": (KEY,)}
    return GuestLogin(**{**fields, **over})


def seed_in(driver, key):
    """What the guest would read: the VM's extraConfig through pyVmomi, decoded as cloud-init does."""
    vm = driver._vm(key)
    extra = {opt.key: opt.value for opt in vm.config.extraConfig}  # vSphere keeps one per key; vcsim appends
    if not extra.get("guestinfo.userdata"):
        return None, None
    meta = guestinfo.decode(extra["guestinfo.metadata"], extra["guestinfo.metadata.encoding"])
    user = guestinfo.decode(extra["guestinfo.userdata"], extra["guestinfo.userdata.encoding"]).decode()
    assert user.startswith("#cloud-config\n")
    return json.loads(meta), yaml.safe_load(user)


def reconfigures(driver, key):
    from pyVmomi import vim

    manager = driver.si.content.eventManager
    events = manager.QueryEvents(
        vim.event.EventFilterSpec(entity=vim.event.EventFilterSpec.ByEntity(entity=driver._vm(key), recursion="self"))
    )
    return sum(isinstance(event, vim.event.VmReconfiguredEvent) for event in events)


# --- the encoding ---------------------------------------------------------------------------


def test_the_metadata_carries_hostname_instance_id_and_the_network_config():
    values = guestinfo.values(guest())

    assert values["guestinfo.metadata.encoding"] == "base64"
    meta = json.loads(guestinfo.decode(values["guestinfo.metadata"], "base64"))
    assert (meta["instance-id"], meta["local-hostname"]) == ("i-vm-1", "lab-1")
    assert meta["network.encoding"] == "base64"
    network = yaml.safe_load(guestinfo.decode(meta["network"], "base64"))
    assert network == yaml.safe_load(cloudinit.network_config())
    assert meta["redact"] == ["userdata"]  # cloud-init overwrites the user-data in guestinfo once read
    assert HASH not in json.dumps(meta)


def test_the_user_data_is_the_nocloud_cloud_config_gzipped():
    values = guestinfo.values(guest())

    assert values["guestinfo.userdata.encoding"] == "gzip+base64"
    assert guestinfo.decode(values["guestinfo.userdata"], "gzip+base64").decode() == cloudinit.user_data(guest())
    assert HASH not in values["guestinfo.userdata"] and "alice" not in values["guestinfo.userdata"]


def test_the_same_guest_encodes_to_the_same_values():
    assert guestinfo.values(guest()) == guestinfo.values(guest())
    assert guestinfo.values(guest())["vclmgr.seed"] != guestinfo.values(guest(password_hash=OTHER_HASH))["vclmgr.seed"]


# --- on vcsim -------------------------------------------------------------------------------


@pytest.mark.slow
def test_create_writes_the_seed_cloud_init_reads(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())

    driver.create(spec)

    meta, user = seed_in(driver, spec.key)
    assert (meta["instance-id"], meta["local-hostname"]) == ("i-vm-1", "lab-1")
    assert user["hostname"] == "lab-1"
    assert user["users"][0]["name"] == "alice"
    assert user["users"][0]["passwd"] == HASH
    assert user["users"][0]["ssh_authorized_keys"] == [KEY]


@pytest.mark.slow
def test_a_clone_gets_its_own_seed_and_a_captured_template_keeps_none(vmware_peer):
    source, target = vmware_peer.source, vmware_peer.target
    source.stage_image(vmware_peer.image)
    golden = vmware_peer.spec(guest=guest(login="firstuser"))
    source.create(golden)
    template = source.capture(golden.key, f"golden-{golden.key}")

    template_extra = {opt.key: opt.value for opt in source._find(template.location).config.extraConfig}
    assert not template_extra.get("guestinfo.userdata") and not template_extra.get("guestinfo.metadata")

    spec = vmware_peer.spec(image=template, guest=guest(instance_id="i-clone", hostname="lab-2"))
    target.stage_image(template)
    target.create(spec)

    meta, user = seed_in(target, spec.key)
    assert (meta["instance-id"], meta["local-hostname"]) == ("i-clone", "lab-2")
    assert [u["name"] for u in user["users"]] == ["alice"]


@pytest.mark.slow
def test_a_retried_create_keeps_one_vm_and_its_seed(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())
    first = driver.create(spec)

    again = driver.create(dataclasses.replace(spec, guest=guest(instance_id="i-retry", password_hash=OTHER_HASH)))

    assert again == first
    assert [vm.key for vm in driver.list_vms()].count(spec.key) == 1
    meta, user = seed_in(driver, spec.key)
    assert meta["instance-id"] == "i-vm-1" and user["users"][0]["passwd"] == HASH


@pytest.mark.slow
def test_extra_config_cannot_replace_the_login(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    hostile = {"guestinfo.userdata": "I2Nsb3VkLWNvbmZpZwo=", "guestinfo.userdata.encoding": "base64"}
    extra = {"vmware.extra_config": hostile}
    spec = vmware_peer.spec(guest=guest(), extra=extra)

    driver.create(spec)

    assert seed_in(driver, spec.key)[1]["users"][0]["name"] == "alice"


@pytest.mark.slow
def test_reseed_after_a_revert_gives_the_next_user_a_fresh_seed(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())
    driver.create(spec)
    driver.snapshot(spec.key, "clean")
    driver.revert(spec.key, "clean")
    nextone = guest(instance_id="i-vm-1-r2", login="bob", password_hash=OTHER_HASH, ssh_keys=())

    driver.reseed(spec.key, nextone)

    meta, user = seed_in(driver, spec.key)
    assert meta["instance-id"] == "i-vm-1-r2"
    assert [(u["name"], u["passwd"]) for u in user["users"]] == [("bob", OTHER_HASH)]
    assert HASH not in json.dumps(user) and KEY not in json.dumps(user)


@pytest.mark.slow
def test_a_retried_reseed_changes_nothing(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())
    driver.create(spec)
    driver.reseed(spec.key, guest())  # the seed it already has
    assert reconfigures(driver, spec.key) == 0

    driver.reseed(spec.key, guest(instance_id="i-2"))
    driver.reseed(spec.key, guest(instance_id="i-2"))

    assert reconfigures(driver, spec.key) == 1
    assert seed_in(driver, spec.key)[0]["instance-id"] == "i-2"


@pytest.mark.slow
def test_reseed_refuses_a_new_login_under_the_old_instance_id(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())
    driver.create(spec)

    with pytest.raises(Invalid, match="instance id") as caught:
        driver.reseed(spec.key, guest(password_hash=OTHER_HASH))

    assert caught.value.permanent
    assert seed_in(driver, spec.key)[1]["users"][0]["passwd"] == HASH


@pytest.mark.slow
def test_reseed_needs_a_stopped_vm_and_none_clears_the_seed(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())
    driver.create(spec)
    driver.start(spec.key)

    with pytest.raises(Conflict, match="stop it first"):
        driver.reseed(spec.key, guest(instance_id="i-2"))

    driver.stop(spec.key, force=True)
    driver.reseed(spec.key, None)
    assert seed_in(driver, spec.key) == (None, None)


@pytest.mark.slow
def test_no_secret_in_results_logs_or_errors(vmware_peer, caplog):
    driver = vmware_peer.source
    caplog.set_level(logging.DEBUG)
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest())
    secrets = [HASH, OTHER_HASH, KEY.split()[1], *guestinfo.values(guest()).values()]
    secrets = [s for s in secrets if len(s) > 20]  # the encoded values and the secrets themselves

    shown = [driver.create(spec), driver.list_vms(), driver.facts(), driver.state(spec.key)]
    driver.reseed(spec.key, guest(instance_id="i-2", password_hash=OTHER_HASH))
    shown += [driver.list_vms(), driver._info(driver._vm(spec.key))]
    with pytest.raises(Invalid) as caught:
        driver.reseed(spec.key, guest(instance_id="i-2", password_hash=HASH))
    with pytest.raises(Invalid) as bad_image:
        driver.reseed(spec.key, guest(instance_id="i-3", image_user_data="#cloud-config\nusers: alice\n"))

    text = "\n".join(map(repr, shown)) + str(caught.value) + str(bad_image.value) + caplog.text
    assert not [s for s in secrets if s in text]
    assert "alice" not in repr(driver.list_vms())


@pytest.mark.slow
def test_a_seed_that_cannot_be_built_makes_no_vm(vmware_peer):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(guest=guest(image_user_data="#cloud-config\nusers:\n  - name: alice\n"))

    with pytest.raises(Invalid, match="cannot build the guest's seed") as caught:
        driver.create(spec)

    assert caught.value.permanent
    assert driver.state(spec.key) == VMState.ABSENT
