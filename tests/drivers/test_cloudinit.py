"""The NoCloud seed: user-data that cloud-init's own checker accepts, a login the image's
user-data cannot take away, and an ISO that reads back as a ``cidata`` volume."""

import io
import shutil
import subprocess

import pycdlib
import pytest
import yaml
from passlib.hash import sha512_crypt

from drivers import cloudinit
from drivers.cloudinit import GuestLogin, SeedError

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnlyxxxxxxxxxxxxxxxxxxxxxxxxx alice@laptop"
HASH = cloudinit.password_hash("one-time-Secret-1")


def guest(**over):
    fields = {
        "instance_id": "vm-42",
        "hostname": "lab-42",
        "login": "alice",
        "password_hash": HASH,
        "ssh_keys": (KEY + "\n",),
    }
    return GuestLogin(**{**fields, **over})


def cloud_config(text):
    assert text.startswith("#cloud-config\n")
    return yaml.safe_load(text)


def schema_check(tmp_path, text):
    if shutil.which("cloud-init") is None:
        pytest.fail("cloud-init is not installed (Debian cloud-init; make install-dev)", pytrace=False)
    path = tmp_path / "user-data"
    path.write_text(text)
    return subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True)


def test_the_user_data_passes_cloud_inits_own_schema_check(tmp_path):
    image = "#cloud-config\npackages: [htop]\nusers: [default]\nruncmd:\n  - [touch, /etc/lab-image]\n"
    for text in (cloudinit.user_data(guest()), cloudinit.user_data(guest(image_user_data=image))):
        check = schema_check(tmp_path, text)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "Valid cloud-config" in check.stdout


def test_the_checker_is_not_a_rubber_stamp(tmp_path):
    check = schema_check(tmp_path, "#cloud-config\nusers:\n- name: alice\n  lock_passwd: maybe\n")
    assert check.returncode != 0


def test_it_creates_the_login_with_hash_keys_and_hostname():
    doc = cloud_config(cloudinit.user_data(guest()))
    assert doc["hostname"] == "lab-42"
    assert doc["ssh_pwauth"] is True
    [user] = doc["users"]
    assert user["name"] == "alice"
    assert user["lock_passwd"] is False
    assert user["ssh_authorized_keys"] == [KEY]
    assert sha512_crypt.verify("one-time-Secret-1", user["passwd"])
    assert "one-time-Secret-1" not in cloudinit.user_data(guest())


def test_a_key_only_login_has_its_password_locked():
    doc = cloud_config(cloudinit.user_data(guest(password_hash=None)))
    assert doc["users"][0]["lock_passwd"] is True
    assert "passwd" not in doc["users"][0]
    assert doc["ssh_pwauth"] is False


def test_the_hash_is_sha512_crypt_without_the_crypt_module():
    h = cloudinit.password_hash("x")
    assert h.startswith("$6$") and h != cloudinit.password_hash("x")  # salted
    assert sha512_crypt.verify("x", h)


def test_meta_data_and_network_config():
    assert yaml.safe_load(cloudinit.meta_data(guest())) == {"instance-id": "vm-42", "local-hostname": "lab-42"}
    net = yaml.safe_load(cloudinit.network_config())
    assert net == {"version": 2, "ethernets": {"nics": {"match": {"name": "e*"}, "dhcp4": True}}}


def test_image_user_data_is_merged_after_the_login():
    image = "#cloud-config\nusers:\n  - default\n  - name: labadmin\n    lock_passwd: true\npackages: [htop]\n"
    doc = cloud_config(cloudinit.user_data(guest(image_user_data=image)))
    assert [u if isinstance(u, str) else u["name"] for u in doc["users"]] == ["alice", "default", "labadmin"]
    assert doc["packages"] == ["htop"]


@pytest.mark.parametrize(
    "image",
    [
        "#cloud-config\nusers:\n  - name: alice\n    lock_passwd: true\n",  # redefine the login
        "#cloud-config\nusers: alice\n",  # a string replaces the whole list
        "#cloud-config\nusers: {name: bob}\n",
        "#cloud-config\nuser: {name: alice, lock_passwd: true}\n",
        "#cloud-config\nuser: alice\n",
        "#cloud-config\nchpasswd: {users: [{name: alice, password: RANDOM, type: RANDOM}]}\n",
        "#cloud-config\nchpasswd: {list: ['alice:hunter2']}\n",
        "#cloud-config\nhostname: other\n",
        "#cloud-config\nfqdn: other.example.org\n",
        "#cloud-config\nssh_pwauth: false\n",
        "#!/bin/sh\nuserdel alice\n",  # not cloud-config: cannot be merged
        "#cloud-config\n- a list\n",
        "#cloud-config\nusers: [\n",
    ],
)
def test_it_rejects_image_user_data_that_would_take_the_login_away(image):
    with pytest.raises(SeedError):
        cloudinit.user_data(guest(image_user_data=image))


@pytest.mark.parametrize(
    "over",
    [
        {"login": "root"},
        {"login": "Alice"},
        {"login": "al ice"},
        {"hostname": "lab_42"},
        {"hostname": "-lab"},
        {"password_hash": "one-time-Secret-1"},  # a clear password is never accepted
        {"password_hash": "$1$abc$defdefdefdefdefdefdefd"},  # MD5 crypt: not SHA-512
        {"ssh_keys": ("ssh-ed25519 AAAA one\nssh-ed25519 BBBB two",)},
        {"ssh_keys": (), "password_hash": None},  # no way in at all
        {"instance_id": ""},
    ],
)
def test_it_rejects_a_guest_configuration_that_cannot_work(over):
    with pytest.raises(SeedError):
        guest(**over)


def test_the_iso_reads_back_as_a_cidata_volume_with_exact_names():
    files = cloudinit.seed_files(guest())
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(cloudinit.seed_iso(files)))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"
        assert iso.has_rock_ridge() and iso.has_joliet()
        names = sorted(child.rock_ridge.name().decode() for child in iso.list_children(rr_path="/") if child.is_file())
        assert names == ["meta-data", "network-config", "user-data"]
        for name, data in files.items():
            for path in ({"rr_path": f"/{name}"}, {"joliet_path": f"/{name}"}):
                out = io.BytesIO()
                iso.get_file_from_iso_fp(out, **path)
                assert out.getvalue() == data
    finally:
        iso.close()


def test_the_iso_refuses_files_nocloud_does_not_read():
    with pytest.raises(SeedError):
        cloudinit.seed_iso({"vendor-secrets": b"x"})


# --- the cloudbase-init flavour (Windows images) ----------------------------------------------

CLEAR = "One-time-Secret-9"


def windows(**over):
    fields = {
        "instance_id": "vm-43",
        "hostname": "lab-43",
        "login": "alice",
        "password": CLEAR,
        "ssh_keys": (KEY,),
        "flavour": "cloudbase-init",
    }
    return GuestLogin(**{**fields, **over})


def test_a_windows_guest_gets_its_user_with_the_clear_password_in_the_rdp_groups():
    doc = cloud_config(cloudinit.user_data(windows()))
    assert doc == {
        "set_hostname": "lab-43",
        "users": [
            {
                "name": "alice",
                "groups": ["Administrators", "Remote Desktop Users"],
                "passwd": CLEAR,
                "ssh_authorized_keys": [KEY],
            }
        ],
    }  # cloudbase-init's dialect: nothing it does not read (sudo, shell, lock_passwd, ssh_pwauth)
    assert "$6$" not in cloudinit.user_data(windows())
    assert yaml.safe_load(cloudinit.meta_data(windows())) == {"instance-id": "vm-43", "local-hostname": "lab-43"}


def test_the_windows_user_data_passes_cloud_inits_schema_check_too(tmp_path):
    # cloud-init's schema accepts this document (set_hostname is a key it ignores; passwd a
    # string); the check guards the YAML's shape. cloud-init itself would take that passwd for a
    # hash, which is why only the cloudbase-init flavour ever carries the clear password.
    check = schema_check(tmp_path, cloudinit.user_data(windows()))
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_key_only_windows_login_has_no_passwd():
    [user] = cloud_config(cloudinit.user_data(windows(password=None)))["users"]
    assert "passwd" not in user and user["ssh_authorized_keys"] == [KEY]


def test_the_password_is_not_in_the_repr():
    assert CLEAR not in repr(windows()) and "password=" not in repr(windows())
    assert HASH not in repr(guest())


def test_a_linux_guest_refuses_a_clear_password():
    with pytest.raises(SeedError, match="only for cloudbase-init"):
        guest(password_hash=None, password=CLEAR)
    with pytest.raises(SeedError, match="only for cloudbase-init"):
        guest(password=CLEAR)


def test_a_windows_guest_refuses_a_hash():
    with pytest.raises(SeedError, match="Windows cannot take a hash"):
        windows(password_hash=HASH)


def test_an_unknown_flavour_is_refused():
    with pytest.raises(SeedError, match="flavour"):
        guest(flavour="sysprep")


@pytest.mark.parametrize("login", ["Jörg Müller", "first.last", "a" * 20, "ALICE-1"])
def test_windows_login_names_windows_allows(login):
    assert windows(login=login).login == login


@pytest.mark.parametrize(
    "login",
    [
        "",
        "a" * 21,
        "Administrator",
        "guest",
        "a/b",
        "a\\b",
        "a@b",
        "a:b",
        "a*b",
        'a"b',
        "...",
        "  ",
        "alice\n",
        "tab\tbed",
    ],
)
def test_windows_login_names_windows_refuses(login):
    with pytest.raises(SeedError, match="Windows user name"):
        windows(login=login)


def test_a_posix_login_with_a_trailing_newline_is_refused():
    with pytest.raises(SeedError, match="POSIX"):
        guest(login="alice\n")


def test_a_windows_login_name_is_at_most_20_and_never_administrator():
    assert cloudinit.login_name("a-very-long-user-name@example.org", flavour="cloudbase-init") == "a-very-long-user-nam"
    assert cloudinit.login_name("Administrator", flavour="cloudbase-init") == "vcl"
    assert cloudinit.login_name("Administrator") == "administrator"  # a fine name on Linux


def test_the_image_cannot_take_the_windows_login_or_hostname():
    for image in ("#cloud-config\nset_hostname: other\n", "#cloud-config\nusers:\n  - name: ALICE\n    passwd: x\n"):
        with pytest.raises(SeedError, match="set_hostname|reservation's login"):
            cloudinit.user_data(windows(image_user_data=image))
    doc = cloud_config(cloudinit.user_data(windows(image_user_data="#cloud-config\nset_timezone: UTC\n")))
    assert doc["set_timezone"] == "UTC" and doc["users"][0]["passwd"] == CLEAR
