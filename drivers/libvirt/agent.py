"""The guest command channel over QEMU's guest agent (``qemuAgentCommand`` through libvirt).

A command runs under a small ``/bin/sh`` wrapper started by ``guest-exec``: it makes the
directory ``/tmp/vclmgr-exec/<tag>`` (``mkdir`` fails if it exists, so a second start with
the same tag starts nothing: idempotent by tag), runs the command in the work directory with
stdout and stderr into ``out`` there, and writes the exit status into ``status`` when it ends
(written aside and renamed, so a reader never sees half of it). ``guest-exec-status`` alone
would give the output only once the command exited; reading the file with
``guest-file-seek``/``guest-file-read`` gives it as it is produced, from any offset, and keeps
working for a reader that lost its place (a worker that died). Killing a command is
destroying its VM. ``guest-exec`` replaces the environment, so a PATH and HOME are given
unless the caller sets them.
"""

import base64
import json
import time

import libvirt

from drivers import base
from drivers.base import ExecStatus, Invalid, NotFound
from drivers.warmlogin import HASH_FILE, HOST_KEY_DIR, PERSONALISE, SET_HASH, host_key, identity_arguments

EXEC_DIR = "/tmp/vclmgr-exec"
DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
WRAPPER = (
    f'd={EXEC_DIR}/$0; mkdir -p {EXEC_DIR} && mkdir "$d" 2>/dev/null || exit 0; '
    'if cd "$1" 2>/dev/null; then shift; "$@" >"$d/out" 2>&1 </dev/null; s=$?; '
    'else echo "vclmgr: no work directory $1" >"$d/out"; s=127; fi; '
    'echo $s >"$d/status.part" && mv "$d/status.part" "$d/status"'
)
# Regular files under "$0" matching the patterns (the shell's globbing; patterns hold no spaces).
GLOB = (
    'cd "$0" 2>/dev/null || exit 0; for p in "$@"; do for f in $p; do [ -f "$f" ] && printf \'%s\\n\' "$f"; done; done'
)
AGENT_TIMEOUT = 10  # s per agent call
START_TIMEOUT = 60  # s for a started wrapper to make its directory
READ_CHUNK = 1 << 20  # bytes per guest-file-read (the agent's own limit is far above)


def command(dom, name, timeout=AGENT_TIMEOUT, **arguments):
    import libvirt_qemu  # ships with libvirt-python; only the agent calls need it

    request = {"execute": name, **({"arguments": arguments} if arguments else {})}
    answer = libvirt_qemu.qemuAgentCommand(dom, json.dumps(request), timeout, 0)
    return json.loads(answer)["return"]


def start(dom, tag, argv, env, workdir):
    """Start the command under the wrapper; returns once its directory is there, since
    ``guest-exec`` answers when the wrapper is spawned, not when it has run its ``mkdir``
    (on a loaded emulated guest that takes seconds), and a status read in between would find
    no command. A wrapper that already ended ran, or found the tag's directory of an earlier start."""
    base.check_exec(tag, argv, env)
    variables = {**DEFAULT_ENV, **(env or {})}
    pid = command(
        dom,
        "guest-exec",
        path="/bin/sh",
        arg=["-c", WRAPPER, tag, workdir, *argv],
        env=[f"{k}={v}" for k, v in variables.items()],
    )["pid"]
    where = f"{EXEC_DIR}/{tag}"
    deadline = time.monotonic() + START_TIMEOUT
    while not command(dom, "guest-exec-status", pid=pid).get("exited"):
        if run(dom, ["/bin/sh", "-c", 'test -d "$0"', where])[0] == 0:
            return
        if time.monotonic() > deadline:
            raise base.DriverError(
                f"command {tag} did not start within {START_TIMEOUT} s in the guest", permanent=False
            )
        time.sleep(0.1)


def run(dom, argv, timeout=60):
    """Run a short helper command to its end; ``(exit status, output)``. Its status is asked
    for again after 20 ms, then twice as long each time up to 0.1 s: most of these commands
    end within a few tens of milliseconds, and a warm start's login waits on several of them."""
    pid = command(dom, "guest-exec", path=argv[0], arg=list(argv[1:]), **{"capture-output": True})["pid"]
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        status = command(dom, "guest-exec-status", pid=pid)
        if status.get("exited"):
            out = base64.b64decode(status.get("out-data", "")) + base64.b64decode(status.get("err-data", ""))
            return status.get("exitcode", -1), out
        if time.monotonic() > deadline:
            raise base.DriverError(f"{argv[0]} did not end within {timeout} s in the guest", permanent=False)
        time.sleep(pause)
        pause = min(2 * pause, 0.1)


def read(dom, path, offset=0, limit=READ_CHUNK):
    """Up to ``limit`` bytes of the guest file ``path`` from ``offset``; None when it does not exist."""
    try:
        handle = command(dom, "guest-file-open", path=path, mode="r")
    except libvirt.libvirtError as exc:
        if "No such file" in str(exc) or "failed to open" in str(exc):
            return None
        raise
    try:
        if offset:
            command(dom, "guest-file-seek", handle=handle, offset=offset, whence="set")
        data = b""
        while len(data) < limit:
            got = command(dom, "guest-file-read", handle=handle, count=min(READ_CHUNK, limit - len(data)))
            data += base64.b64decode(got.get("buf-b64", ""))
            if got.get("eof") or not got.get("count"):
                break
        return data
    finally:
        command(dom, "guest-file-close", handle=handle)


def status(dom, tag, offset, limit):
    where = f"{EXEC_DIR}/{tag}"
    code = read(dom, f"{where}/status", limit=32)  # first: all its output is written when this exists
    output = read(dom, f"{where}/out", offset, limit)
    if output is None and code is None and run(dom, ["/bin/sh", "-c", 'test -d "$0"', where])[0] != 0:
        raise NotFound(f"no command {tag} in the guest")
    output = output or b""
    if code is None or len(output) == limit:
        return ExecStatus(exited=False, output=output)
    try:
        return ExecStatus(exited=True, exit_status=int(code.strip()), output=output)
    except ValueError:
        raise base.DriverError(f"command {tag}: unreadable exit status {code[:20]!r}", permanent=True) from None


def put(dom, path, data, make_parent=True):
    """``data`` into the guest file ``path`` (its directory made first unless ``make_parent``
    is False: the caller made it)."""
    parent = path.rsplit("/", 1)[0] or "/"
    code, out = run(dom, ["/bin/mkdir", "-p", parent]) if make_parent else (0, b"")
    if code != 0:
        raise Invalid(f"cannot make {parent} in the guest: {out[:200].decode(errors='replace')}")
    handle = command(dom, "guest-file-open", path=path, mode="w")
    try:
        for at in range(0, len(data), READ_CHUNK):
            chunk = base64.b64encode(data[at : at + READ_CHUNK]).decode()
            command(dom, "guest-file-write", handle=handle, **{"buf-b64": chunk})
        command(dom, "guest-file-flush", handle=handle)
    finally:
        command(dom, "guest-file-close", handle=handle)


def get(dom, path, limit):
    data = read(dom, path, 0, limit + 1)
    if data is None:
        raise NotFound(f"no file {path} in the guest")
    if len(data) > limit:
        raise Invalid(f"{path} in the guest is over the limit of {limit} bytes")
    return data


def glob(dom, directory, patterns):
    code, out = run(dom, ["/bin/sh", "-c", GLOB, directory, *patterns])
    if code not in (0, 1):
        raise base.DriverError(f"listing {directory} in the guest failed ({code})", permanent=False)
    return sorted({line for line in out.decode(errors="replace").splitlines() if line})


def personalise(dom, guest):
    """The warm guest's new identity and ``guest``'s login (``Driver.personalise``)."""
    for n, (name, data) in enumerate(host_key().items()):  # root's files, read by the script below
        put(dom, f"{HOST_KEY_DIR}/{name}", data, make_parent=n == 0)  # one directory for all three
    code, out = run(dom, ["/bin/sh", "-c", PERSONALISE, *identity_arguments(guest, HOST_KEY_DIR)])
    if code != 0:
        raise base.DriverError(
            f"the guest refused its new identity (step {code}): {out[-300:].decode(errors='replace')}", permanent=True
        )
    if guest.password_hash:
        try:
            dom.setUserPassword(guest.login, guest.password_hash, libvirt.VIR_DOMAIN_PASSWORD_ENCRYPTED)
        except libvirt.libvirtError:  # no chpasswd in the guest (the agent needs it): the hash written directly
            put(dom, HASH_FILE, guest.password_hash.encode())
            code, out = run(dom, ["/bin/sh", "-c", SET_HASH, guest.login, HASH_FILE])
            if code != 0:
                why = out[-300:].decode(errors="replace")
                raise base.DriverError(f"the guest refused the password: {why}", permanent=True) from None
    dom.authorizedSSHKeysSet(guest.login, list(guest.ssh_keys), 0)  # replaces them all: only this user's
