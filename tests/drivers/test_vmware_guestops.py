"""The pure parts of the VMware guest command channel (``vmware/guestops.py``), without a server.

The wrapper is run by this machine's ``/bin/sh`` the way VMware Tools run a ProgramSpec on a
Linux guest: the program path and its ``arguments`` string joined into one line for ``sh -c``,
in an environment made of ``envVariables`` only.
"""

import subprocess

import pytest
from pyVmomi import vim, vmodl

from drivers.base import Conflict, DriverError, Invalid, NotFound
from drivers.vmware import guestops
from drivers.vmware.driver import VMwareDriver

ODD = ["a b", "it's", '"quoted"', "$HOME", "`id`", "$(id)", "x;y", "a\nb", "*", "back\\slash", "", "-n"]


def run_as_tools_would(tmp_path, tag, argv, env=None, workdir=None):
    """Start the wrapper as VMware Tools start ``/bin/sh`` with the spec's arguments; wait for it."""
    exec_dir = tmp_path / "exec"
    line = "/bin/sh " + guestops.program_arguments(tag, str(workdir or tmp_path), argv, exec_dir=str(exec_dir))
    variables = guestops.environment(env)
    subprocess.run(["/usr/bin/env", "-i", *variables, "/bin/sh", "-c", line], check=True, timeout=30)
    where = exec_dir / tag
    return where


def test_every_argument_reaches_the_command_as_it_was(tmp_path):
    where = run_as_tools_would(tmp_path, "t1", ["printf", "[%s]\\n", *ODD])

    assert (where / "out").read_bytes().decode() == "".join(f"[{word}]\n" for word in ODD)
    assert (where / "status").read_text().strip() == "0"
    assert (where / "pid").read_text().strip().isdigit()


def test_the_work_directory_and_environment_are_the_callers(tmp_path):
    workdir = tmp_path / "work dir 'x'"
    workdir.mkdir()
    env = {"CI": "1", "ODD": "a b;$(id)'\""}
    where = run_as_tools_would(
        tmp_path, "t2", ["/bin/sh", "-c", 'pwd; printf "%s|%s|%s\\n" "$CI" "$ODD" "$PATH"'], env, workdir
    )

    assert (where / "out").read_text().splitlines() == [str(workdir), f"1|{env['ODD']}|{guestops.DEFAULT_PATH}"]


def test_a_second_start_with_the_same_tag_runs_nothing(tmp_path):
    counter = tmp_path / "count"
    argv = ["/bin/sh", "-c", f"echo run >>{counter}; exit 3"]
    run_as_tools_would(tmp_path, "t3", argv)
    where = run_as_tools_would(tmp_path, "t3", argv)

    assert counter.read_text() == "run\n"
    assert (where / "status").read_text().strip() == "3"


def test_a_missing_work_directory_is_status_127_with_a_reason(tmp_path):
    where = run_as_tools_would(tmp_path, "t4", ["true"], workdir=tmp_path / "nowhere")

    assert (where / "status").read_text().strip() == "127"
    assert b"no work directory" in (where / "out").read_bytes()


def test_the_callers_path_wins_over_the_default():
    assert guestops.environment({"PATH": "/opt/bin"}) == ["PATH=/opt/bin"]
    assert guestops.environment(None) == [f"PATH={guestops.DEFAULT_PATH}"]


def test_progress_from_the_status_and_output_files():
    assert guestops.progress("t", None, None, 100) == guestops.ExecStatus(exited=False, output=b"")
    assert guestops.progress("t", b"0\n", b"done\n", 100) == guestops.ExecStatus(True, 0, b"done\n")
    # A full page: more may follow, so the end is told only once the reader has it all.
    assert guestops.progress("t", b"2\n", b"x" * 100, 100).exited is False
    # A wrapper that ended without its status (killed): its exit code, as the guest reports it.
    assert guestops.progress("t", None, b"part", 100, ended=137) == guestops.ExecStatus(True, 137, b"part")
    with pytest.raises(DriverError, match="unreadable exit status") as caught:
        guestops.progress("t", b"garbage", b"", 100)
    assert caught.value.permanent


def test_a_transfer_url_naming_host_star_goes_to_the_sessions_host():
    endpoint = ("https", "vc.example.org", 8443, "/sdk")

    assert guestops.transfer_target("https://*/guestFile?id=1&token=a", endpoint) == (
        "https",
        "vc.example.org",
        8443,
        "/guestFile?id=1&token=a",
    )
    assert guestops.transfer_target("https://esx01.example.org:443/guestFile?id=2", endpoint) == (
        "https",
        "esx01.example.org",
        443,
        "/guestFile?id=2",
    )
    assert guestops.transfer_target("http://esx02/guestFile", endpoint)[1:3] == ("esx02", 80)


def test_glob_matches_each_path_component_as_the_shell_does():
    tree = {
        "/w": [
            (".", "directory"),
            ("..", "directory"),
            ("a.xml", "file"),
            (".hidden.xml", "file"),
            ("out", "directory"),
            ("link.xml", "symlink"),
            ("b.txt", "file"),
        ],
        "/w/out": [("r1.xml", "file"), ("r2.xml", "file"), ("sub", "directory")],
        "/w/out/sub": [("deep.xml", "file")],
    }

    def list_dir(path):
        return tree.get(path)

    assert guestops.glob(list_dir, "/w", ["*.xml"]) == ["a.xml"]
    assert guestops.glob(list_dir, "/w/", ["out/*.xml", "b.txt", ".h*"]) == [
        ".hidden.xml",
        "b.txt",
        "out/r1.xml",
        "out/r2.xml",
    ]
    assert guestops.glob(list_dir, "/w", ["*/*/*.xml", "../*", "missing/*"]) == ["out/sub/deep.xml"]
    assert guestops.glob(list_dir, "/nowhere", ["*"]) == []


@pytest.mark.parametrize(
    ("fault", "error", "words"),
    [
        (vim.fault.GuestOperationsUnavailable(), DriverError, "VMware Tools on VM vcl-1 do not offer guest operations"),
        (vim.fault.InvalidGuestLogin(), Invalid, "refused the login of its image's guest user 'svc'"),
        (vim.fault.GuestPermissionDenied(), Invalid, "permission denied in the guest"),
        (vim.fault.InvalidPowerState(), Conflict, "not powered on"),
        (vim.fault.FileNotFound(file="/x"), NotFound, "no such file"),
        (
            vmodl.fault.MethodNotFound(method="ListFilesInGuest"),
            Invalid,
            "does not implement the guest operation ListFilesInGuest",
        ),
        (vim.fault.OperationDisabledByGuest(), Invalid, "refuse guest operations"),
    ],
)
def test_guest_faults_say_what_went_wrong(fault, error, words):
    translated = guestops.guest_fault(fault, "vcl-1", "write /tmp/x", "svc")

    assert type(translated) is error and words in str(translated)
    # Tools that are not up yet may be soon (a guest still booting): only that one is temporary.
    assert translated.permanent == (not isinstance(fault, vim.fault.GuestOperationsUnavailable))


def test_a_vm_whose_image_has_no_guest_login_is_refused_before_any_call():
    # Nothing listens on port 1: had the driver called vSphere, this would be Unreachable.
    driver = VMwareDriver("https://127.0.0.1:1/sdk", {"username": "u", "password": "p"})
    for call in (
        lambda: driver.guest_exec("vcl-1", "run-1", ["true"]),
        lambda: driver.guest_exec_status("vcl-1", "run-1"),
        lambda: driver.guest_put_file("vcl-1", "/tmp/x", b"x"),
        lambda: driver.guest_get_file("vcl-1", "/tmp/x", 10),
        lambda: driver.guest_glob("vcl-1", "/tmp", ["*"]),
    ):
        with pytest.raises(Invalid, match="its image has none") as caught:
            call()
        assert caught.value.permanent
    half = VMwareDriver("https://127.0.0.1:1/sdk", {"guest": {"username": "svc", "password": ""}})
    with pytest.raises(Invalid, match="its image has none"):
        half.guest_put_file("vcl-1", "/tmp/x", b"x")
