"""A warm VM on VMware: its running snapshot keeps memory, its Tools are its agent, and its
login goes in through guest operations (``vmware/handover.py``).

vcsim (Debian's govmomi 0.24) implements no ProcessManager call and runs file transfers only
for a VM backed by a container (a container engine this machine has not): the hand-over is
followed on vcsim up to its first guest operation; what it runs in the guest is run here by
this machine's ``/bin/sh`` the way VMware Tools would, with stand-in scripts that record what
they were given."""

import subprocess

import pytest

from drivers.base import Conflict, DriverError, ExecStatus, Invalid, NotFound
from drivers.cloudinit import GuestLogin
from drivers.vmware import guestops, handover

GUEST = {"username": "vclmgr-svc", "password": "svc-guest-secret-4e1"}  # noqa: S105 (made up here)
LOGIN = GuestLogin(
    instance_id="vcl-9-x",
    hostname="lab-7",
    login="alice",
    password_hash="$6$saltsalt$" + "Secr3tHash" * 8 + "abcdef",  # made up here
    ssh_keys=("ssh-ed25519 AAAAC3Nza alice@lab",),
)


def running(peer, tools=True, **options):
    extra = dict(peer.spec_extra["vmware.extra_config"])
    if tools:  # vcsim has no Tools: how it lets a test play a guest whose Tools run
        extra["SET.guest.toolsRunningStatus"] = "guestToolsRunning"
    peer.source.stage_image(peer.image)
    spec = peer.spec(extra={"vmware.extra_config": extra})
    peer.source.create(spec)
    peer.source.start(spec.key)
    source = peer.source
    driver = type(source)(source.uri, {**source.credentials, "guest": GUEST}, {**source.options, **options})
    return driver, spec.key


@pytest.mark.slow
def test_a_running_vms_snapshot_keeps_its_memory_and_a_stopped_ones_has_none(vmware_peer, monkeypatch):
    driver, key = running(vmware_peer)
    asked = []
    call = driver._call

    def spy(context, fn, *args, **kwargs):
        if "memory" in kwargs:  # CreateSnapshot_Task
            asked.append((kwargs["name"], kwargs["memory"]))
        return call(context, fn, *args, **kwargs)

    monkeypatch.setattr(driver, "_call", spy)
    driver.snapshot(key, "warm")
    driver.stop(key, force=True)
    driver.snapshot(key, "clean")

    assert asked == [("warm", True), ("clean", False)]
    tree = {t.name: t.state for t in driver._snapshots(driver._vm(key))}
    assert tree == {"warm": "poweredOn", "clean": "poweredOff"}


@pytest.mark.slow
def test_the_agent_is_vmware_tools(vmware_peer):
    with_tools, key = running(vmware_peer)
    without, other = running(vmware_peer, tools=False)

    assert with_tools.agent_answers(key) is True
    assert without.agent_answers(other) is False


@pytest.mark.slow
def test_a_hand_over_on_vcsim_stops_at_its_first_guest_operation_and_says_why(vmware_peer):
    driver, key = running(vmware_peer)

    with pytest.raises(DriverError, match=f"VMware Tools on VM {key} do not offer guest operations") as caught:
        driver.personalise(key, LOGIN)
    assert not caught.value.permanent  # the warm start then builds the VM cold
    assert LOGIN.password_hash not in str(caught.value) and GUEST["password"] not in str(caught.value)


@pytest.mark.slow
def test_a_guest_without_tools_or_not_running_or_without_a_service_account_is_refused(vmware_peer):
    driver, key = running(vmware_peer, tools=False, tools_timeout=0.3)
    with pytest.raises(DriverError, match=f"VMware Tools do not run in {key}") as caught:
        driver.personalise(key, LOGIN)
    assert not caught.value.permanent

    driver.stop(key, force=True)
    with pytest.raises(Conflict, match="not running"):
        driver.personalise(key, LOGIN)
    with pytest.raises(Invalid, match="need a login in the guest"):
        vmware_peer.source.personalise(key, LOGIN)  # the image has no service account


# --- what runs in the guest, by this machine's shell ----------------------------------------

STAND_IN = 'printf "%s|" "$0" "$@" >> "{log}"; exit {status}\n'


def run_in_guest(tmp_path, login, statuses=None):
    """``AS_ROOT`` started as VMware Tools start the hand-over's command (``/bin/sh`` and the
    ProgramSpec's arguments), on a directory of stand-in scripts that log their arguments."""
    statuses = {"personalise": 0, "set-hash": 0, "set-keys": 0, **(statuses or {})}
    where = tmp_path / "vclmgr-login-x"
    (where / "keys").mkdir(parents=True)
    logs = {}
    for name, status in statuses.items():
        logs[name] = tmp_path / f"{name}.log"
        (where / f"{name}.sh").write_text(STAND_IN.format(log=logs[name], status=status))
    if login.password_hash:
        (where / "hash").write_text(login.password_hash)
    arguments = ["/bin/sh", "-c", handover.AS_ROOT, str(where), "lab-7", login.login, "", "", "id", f"{where}/keys"]
    line = "/bin/sh " + guestops.program_arguments("t1", str(tmp_path), arguments, exec_dir=str(tmp_path / "exec"))
    subprocess.run(["/usr/bin/env", "-i", *guestops.environment({}), "/bin/sh", "-c", line], check=True, timeout=30)
    done = tmp_path / "exec" / "t1"
    ran = {name: log.read_text().rstrip("|").split("|") for name, log in logs.items() if log.exists()}
    return int((done / "status").read_text()), ran, where


def test_the_guest_runs_the_identity_then_the_password_then_the_keys_and_keeps_no_file(tmp_path):
    status, ran, where = run_in_guest(tmp_path, LOGIN)

    assert status == 0
    assert ran["personalise"] == ["lab-7", "alice", "", "", "id", f"{where}/keys"]  # $0 the hostname
    assert ran["set-hash"] == ["alice", f"{where}/hash"]
    assert ran["set-keys"] == ["alice", f"{where}/authorized_keys"]
    assert not where.exists()  # the files (hash, keys, host key) are gone whatever happened


def test_without_a_password_no_hash_is_set(tmp_path):
    status, ran, _where = run_in_guest(tmp_path, GuestLogin("vcl-9-y", "lab-7", "alice", ssh_keys=("k",)))

    assert status == 0 and "set-hash" not in ran and ran["set-keys"][0] == "alice"


def test_a_step_the_guest_refuses_stops_the_rest_and_is_the_status(tmp_path):
    status, ran, where = run_in_guest(tmp_path, LOGIN, {"personalise": 4})

    assert status == 4 and set(ran) == {"personalise"}
    assert not where.exists()


@pytest.mark.slow
def test_a_write_that_fails_removes_the_login_directory_from_the_guest(vmware_peer, monkeypatch):
    driver, key = running(vmware_peer)
    asked = []
    call = guestops.GuestChannel._call

    def spy(self, what, fn, *args, **kwargs):
        asked.append(what)
        return call(self, what, fn, *args, **kwargs)

    def no_command(self, tag, offset, limit):  # vcsim reads no guest file: a guest where none ran
        raise NotFound(f"no command {tag}")

    monkeypatch.setattr(guestops.GuestChannel, "_call", spy)
    monkeypatch.setattr(guestops.GuestChannel, "status", no_command)
    with pytest.raises(DriverError, match="do not offer guest operations") as caught:
        driver.personalise(key, LOGIN)

    assert not caught.value.permanent and asked[0].startswith(f"write {handover.LOGIN_DIR}-")
    assert asked[-1] == f"remove {login_directory(asked[0].removeprefix('write '))}"


def login_directory(path):
    """/tmp/vclmgr-login-<random> of a file written in it."""
    return "/".join(path.split("/")[:3])


class FakeChannel:
    """A guest's command channel whose calls are recorded; ``fail`` names the call that fails
    (temporarily) once."""

    def __init__(self, key, fail=None):
        self.key, self.fail, self.calls, self.commands = key, fail, [], {}

    def _maybe_fail(self, what):
        if self.fail == what:
            self.fail = None
            raise DriverError(f"{what} failed", permanent=False)

    def put(self, path, data, mode=None):
        self.calls.append(("put", path))
        self._maybe_fail("put")

    def start(self, tag, argv, env, workdir):
        self.calls.append(("start", tag, argv[3]))
        self._maybe_fail("start")
        self.commands[tag] = ExecStatus(exited=True, exit_status=0, output=b"")

    def status(self, tag, offset, limit):
        if tag not in self.commands:
            raise NotFound(tag)
        return self.commands[tag]

    def remove_directory(self, path):
        self.calls.append(("remove", path))


@pytest.mark.parametrize("fail", ["put", "start"])
def test_a_failed_hand_over_leaves_no_login_directory_and_its_retry_uses_the_same_tag(fail):
    channel = FakeChannel("vcl-12-warm-3", fail=fail)
    with pytest.raises(DriverError, match="failed"):
        handover.personalise(channel, LOGIN)
    first = login_directory(channel.calls[0][1])
    assert channel.calls[-1] == ("remove", first)

    channel.calls.clear()
    handover.personalise(channel, LOGIN)
    (start,) = [call for call in channel.calls if call[0] == "start"]
    assert start[1] == handover.handover_tag("vcl-12-warm-3") and start[2] != first
    assert not any(call[0] == "remove" for call in channel.calls)  # the command removes its own


def test_a_retry_finds_the_command_already_started_and_starts_no_second():
    channel = FakeChannel("vcl-12-warm-3")
    tag = handover.handover_tag("vcl-12-warm-3")
    channel.commands[tag] = ExecStatus(exited=True, exit_status=0, output=b"")  # started by the try before

    handover.personalise(channel, LOGIN)

    assert channel.calls == []  # no secret written again, nothing started
    assert handover.handover_tag("vcl-12-warm-4") != tag
