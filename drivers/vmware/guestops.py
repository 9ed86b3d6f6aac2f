"""The guest command channel over vSphere's guest operations (VMware Tools in the guest).

Guest operations log in to the guest as one of its own accounts: the image's service
account (the vmware variant's guest user and password, handed to the driver as
``credentials["guest"]``). Without one every call is refused before vSphere is asked. The
password travels to the guest's VMware Tools in each call and is never logged or put into a
message.

A command runs under a ``/bin/sh`` wrapper started by ``ProcessManager.StartProgramInGuest``,
the same as on libvirt (``libvirt/agent.py``): it makes ``/tmp/vclmgr-exec/<tag>`` (``mkdir``
fails if it exists: a second start with the tag runs nothing), writes its pid there, runs the
command in the work directory with stdout and stderr into ``out`` and writes the exit status
into ``status`` when it ends (aside, then renamed). A start first looks for the tag's
directory (``ListFilesInGuest``) and starts nothing when it is there. The status reads
``status`` and ``out`` from an offset (``InitiateFileTransferFromGuest`` and an HTTP GET of
the URL it returns, with a Range header; a server that ignores it is read past the offset);
when ``status`` is missing, ``ListProcessesInGuest`` of the wrapper's pid tells a wrapper
that was killed (it has ended: its ``exitCode`` is the status). VMware Tools run the program
line through the guest's shell, so every argument is quoted for ``sh``; the environment given
replaces the guest's, so a PATH is given unless the caller sets one, and HOME is the
account's own.

Files go in and out with ``InitiateFileTransferToGuest`` / ``…FromGuest`` and an HTTP PUT /
GET of the returned URL, where a host named ``*`` is the host the session talks to.
``guest_glob`` walks directories with ``ListFilesInGuest`` and matches each path component
as the shell would (``*`` matches no ``/`` and no leading ``.``); it lists regular files.
"""

import fnmatch
import http.client
import shlex
import ssl
import urllib.parse

from django.conf import settings
from pyVmomi import vim, vmodl

from drivers import base
from drivers.base import Conflict, DriverError, ExecStatus, Invalid, NotFound, Unreachable
from drivers.vmware.session import translate

EXEC_DIR = "/tmp/vclmgr-exec"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIST_PAGE = 200  # ListFilesInGuest results per call
TOOLS_REFUSE = (vim.fault.GuestComponentsOutOfDate, vim.fault.OperationDisabledByGuest,
                vim.fault.OperationNotSupportedByGuest)  # fmt: skip


class TransferFailed(DriverError):
    """The HTTP transfer of a guest file answered an error status."""


# --- pure parts (no server) ------------------------------------------------------------------


def wrapper(exec_dir=EXEC_DIR):
    """The ``sh -c`` script: ``$0`` the tag, ``$1`` the work directory, the rest the command."""
    return (
        f'd={exec_dir}/$0; mkdir -p {exec_dir} && mkdir "$d" 2>/dev/null || exit 0; echo $$ >"$d/pid"; '
        ': "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"; export HOME; '
        'if cd "$1" 2>/dev/null; then shift; "$@" >"$d/out" 2>&1 </dev/null; s=$?; '
        'else echo "vclmgr: no work directory $1" >"$d/out"; s=127; fi; '
        'echo $s >"$d/status.part" && mv "$d/status.part" "$d/status"'
    )


def program_arguments(tag, workdir, argv, exec_dir=EXEC_DIR):
    """The ``arguments`` of the ProgramSpec that runs ``/bin/sh``: VMware Tools hand the program
    line to the guest's shell, so each word is quoted for it."""
    return " ".join(shlex.quote(word) for word in ["-c", wrapper(exec_dir), tag, workdir, *argv])


def environment(env):
    """``envVariables``: they replace the guest's environment, so PATH is given unless set."""
    variables = {"PATH": DEFAULT_PATH, **(env or {})}
    return [f"{name}={value}" for name, value in variables.items()]


def progress(tag, code, output, limit, ended=None):
    """An ExecStatus from the ``status`` file's bytes (None: not there), the output read
    from the asked offset (None: no ``out`` yet) and, when ``status`` is missing, the exit
    code of a wrapper that ended without writing it (None: still running or not known)."""
    output = output or b""
    if code is None:
        if ended is None or len(output) >= limit:
            return ExecStatus(exited=False, output=output)
        return ExecStatus(exited=True, exit_status=ended, output=output)
    if len(output) >= limit:  # more may follow: the reader comes back for it before the end
        return ExecStatus(exited=False, output=output)
    try:
        return ExecStatus(exited=True, exit_status=int(code.strip()), output=output)
    except ValueError:
        raise DriverError(f"command {tag}: unreadable exit status {code[:20]!r}", permanent=True) from None


def transfer_target(url, endpoint):
    """``(scheme, host, port, path?query)`` of a guest transfer URL; a host named ``*`` (vCenter,
    vcsim) is the host and port the session connects to (``endpoint``: the driver's)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme or endpoint[0]
    if parts.hostname in (None, "", "*"):
        host, port = endpoint[1], endpoint[2]
    else:
        host, port = parts.hostname, parts.port or (443 if scheme == "https" else 80)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return scheme, host, port, target


def glob(list_dir, directory, patterns):
    """The regular files under ``directory`` that match the shell ``patterns`` (relative paths,
    sorted). ``list_dir(path)`` → ``[(name, type)]`` with vSphere's types (file, directory,
    symlink), or None when the directory is missing."""
    found = set()
    for pattern in patterns:
        parts = [part for part in str(pattern).split("/") if part not in ("", ".")]
        if parts and ".." not in parts:
            found.update(_walk(list_dir, directory.rstrip("/") or "/", "", parts))
    return sorted(found)


def _walk(list_dir, root, prefix, parts):
    here = f"{root}/{prefix}" if prefix else root
    entries = list_dir(here) or []
    last = len(parts) == 1
    for name, kind in entries:
        if name in (".", "..") or not _component_matches(name, parts[0]):
            continue
        path = f"{prefix}/{name}" if prefix else name
        if last and kind == "file":
            yield path
        elif not last and kind == "directory":
            yield from _walk(list_dir, root, path, parts[1:])


def _component_matches(name, pattern):
    if name.startswith(".") and not pattern.startswith("."):
        return False  # as the shell: a wildcard does not match a leading dot
    return fnmatch.fnmatchcase(name, pattern)


# --- faults ----------------------------------------------------------------------------------


def guest_fault(exc, key, what, user):
    """A guest operation's fault as a DriverError with a message that says what to do."""
    if isinstance(exc, vim.fault.GuestOperationsUnavailable):
        return DriverError(
            f"VMware Tools on VM {key} do not offer guest operations (are Tools running?): cannot {what}",
            permanent=False,
        )
    if isinstance(exc, vim.fault.InvalidGuestLogin):
        return Invalid(
            f"VM {key}: the guest refused the login of its image's guest user {user!r} (check the vmware "
            f"variant's guest user and password): cannot {what}"
        )
    if isinstance(exc, vim.fault.GuestPermissionDenied):
        return Invalid(f"VM {key}: the guest user {user!r} may not {what} (permission denied in the guest)")
    if isinstance(exc, vim.fault.InvalidPowerState):
        return Conflict(f"VM {key} is not powered on: guest operations need a running VM (cannot {what})")
    if isinstance(exc, vim.fault.FileNotFound):
        return NotFound(f"VM {key}: cannot {what}: no such file or directory in the guest")
    if isinstance(exc, (vmodl.fault.MethodNotFound, vmodl.fault.NotImplemented)):
        method = getattr(exc, "method", None) or type(exc).__name__.rpartition(".")[2]
        return Invalid(f"VM {key}: this vSphere does not implement the guest operation {method} (cannot {what})")
    if isinstance(exc, vim.fault.TooManyGuestLogons):
        return DriverError(f"VM {key}: too many guest logins at once: cannot {what} now", permanent=False)
    if isinstance(exc, TOOLS_REFUSE):
        name = type(exc).__name__.rpartition(".")[2]
        return Invalid(f"VM {key}: VMware Tools in the guest refuse guest operations ({name}): cannot {what}")
    return translate(exc, f"VM {key}: {what}")


# --- the channel -----------------------------------------------------------------------------


class GuestChannel:
    """One VM's guest operations as the image's service account (``login``: username, password)."""

    def __init__(self, driver, key, vm, login):
        self.driver, self.key, self.vm = driver, key, vm
        self.user = login["username"]
        self._auth = vim.vm.guest.NamePasswordAuthentication(
            username=login["username"], password=login["password"], interactiveSession=False
        )
        manager = driver.si.content.guestOperationsManager
        self.files, self.processes = manager.fileManager, manager.processManager

    def _call(self, what, fn, *args, **kwargs):
        try:
            return fn(self.vm, self._auth, *args, **kwargs)
        except DriverError:
            raise
        except Exception as exc:  # noqa: BLE001 (translated: faults and transport errors)
            raise guest_fault(exc, self.key, what, self.user) from exc

    # commands

    def start(self, tag, argv, env, workdir):
        base.check_exec(tag, argv, env)
        if self._exists(EXEC_DIR, tag):
            return  # idempotent by tag: started before (the wrapper's mkdir guards a race too)
        spec = vim.vm.guest.ProcessManager.ProgramSpec(
            programPath="/bin/sh",
            arguments=program_arguments(tag, workdir, argv),
            workingDirectory="/",
            envVariables=environment(env),
        )
        self._call(f"start command {tag}", self.processes.StartProgramInGuest, spec=spec)

    def status(self, tag, offset, limit):
        base.check_exec(tag, ["status"])  # the tag names a guest path: the same rule as at its start
        where = f"{EXEC_DIR}/{tag}"
        code = self.read(f"{where}/status", 0, 32)  # first: all its output is written when this exists
        output = self.read(f"{where}/out", offset, limit)
        ended = None
        if code is None:
            if output is None and not self._exists(EXEC_DIR, tag):
                raise NotFound(f"no command {tag} in {self.key}")
            ended = self._wrapper_ended(where)
            if ended is not None:  # it may have written its status meanwhile
                code = self.read(f"{where}/status", 0, 32)
        return progress(tag, code, output, limit, ended)

    def _wrapper_ended(self, where):
        """The exit code of the tag's wrapper when the guest says it ended, else None."""
        pid = (self.read(f"{where}/pid", 0, 32) or b"").strip()
        if not pid.isdigit():
            return None
        processes = self._call("list processes", self.processes.ListProcessesInGuest, pids=[int(pid)]) or []
        info = next((p for p in processes if p.pid == int(pid)), None)
        if info is None:  # gone, and long enough ago that Tools forgot it (they keep 5 min): killed
            return -1
        if info.endTime is None:
            return None
        return info.exitCode if info.exitCode is not None else -1

    # files

    def read(self, path, offset=0, limit=1 << 20):
        """Up to ``limit`` bytes of the guest file ``path`` from ``offset``; None when it is missing."""
        try:
            info = self._call(f"read {path}", self.files.InitiateFileTransferFromGuest, guestFilePath=path)
        except NotFound:
            return None
        return self._get(info.url, path, offset, limit)

    def get(self, path, limit):
        info = self._call(f"read {path}", self.files.InitiateFileTransferFromGuest, guestFilePath=path)
        if info.size and info.size > limit:  # vSphere tells the size: refuse before any byte moves
            raise Invalid(f"{path} in {self.key} is over the limit of {limit} bytes ({info.size})")
        data = self._get(info.url, path, 0, limit + 1)
        if len(data) > limit:
            raise Invalid(f"{path} in {self.key} is over the limit of {limit} bytes")
        return data

    def put(self, path, data, mode=None):
        """Write ``data`` to the guest file ``path`` (with permissions ``mode``, else the
        guest's default), making its directory when it is missing (the guest refuses that
        either when the transfer is asked for or in the PUT itself)."""
        attributes = vim.vm.guest.FileManager.PosixFileAttributes(permissions=mode)
        args = {"guestFilePath": path, "fileAttributes": attributes, "fileSize": len(data), "overwrite": True}
        try:
            url = self._call(f"write {path}", self.files.InitiateFileTransferToGuest, **args)
            self._transfer("PUT", url, path, body=bytes(data))
            return
        except (NotFound, TransferFailed):
            pass  # a missing directory, most likely: make it and try once more
        self.make_directory(path.rsplit("/", 1)[0] or "/")
        url = self._call(f"write {path}", self.files.InitiateFileTransferToGuest, **args)
        self._transfer("PUT", url, path, body=bytes(data))

    def make_directory(self, path):
        try:
            self._call(
                f"make {path}", self.files.MakeDirectoryInGuest, directoryPath=path, createParentDirectories=True
            )
        except Conflict:
            pass  # there already (made meanwhile)

    def remove_directory(self, path):
        """``path`` and all in it gone (nothing to do when it is missing)."""
        try:
            self._call(f"remove {path}", self.files.DeleteDirectoryInGuest, directoryPath=path, recursive=True)
        except NotFound:
            pass

    def glob(self, directory, patterns):
        return glob(self._list, directory, patterns)

    def _list(self, path):
        """[(name, type)] of the guest directory ``path``; None when it is missing."""
        entries, index = [], 0
        while True:
            try:
                page = self._call(
                    f"list {path}", self.files.ListFilesInGuest, filePath=path, index=index, maxResults=LIST_PAGE
                )
            except NotFound:
                return None
            files = page.files or []
            entries += [(item.path.rsplit("/", 1)[-1], item.type) for item in files]
            index += len(files)
            if not page.remaining or not files:
                return entries

    def _exists(self, directory, name):
        try:
            # (names here are tags and file names of [a-z0-9-]: nothing to escape in the pattern)
            page = self._call(
                f"list {directory}", self.files.ListFilesInGuest, filePath=directory, matchPattern=f"^{name}$"
            )
        except NotFound:
            return False
        return any(item.path.rsplit("/", 1)[-1] == name for item in page.files or [])

    # HTTP to the URL a transfer returned

    def _get(self, url, path, offset, limit):
        headers = {"Range": f"bytes={offset}-{offset + limit - 1}"} if offset else {}
        return self._transfer("GET", url, path, headers=headers, offset=offset, limit=limit)

    def _transfer(self, method, url, path, body=None, headers=None, offset=0, limit=0):
        scheme, host, port, target = transfer_target(url, self.driver.endpoint)
        if scheme == "https":
            insecure = self.driver.options.get("insecure")
            context = ssl._create_unverified_context() if insecure else ssl.create_default_context()  # noqa: S323
            conn = http.client.HTTPSConnection(host, port, timeout=settings.VCLMGR_VSPHERE_TIMEOUT, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=settings.VCLMGR_VSPHERE_TIMEOUT)
        headers = dict(headers or {})
        if body is not None:
            headers.update({"Content-Length": str(len(body)), "Content-Type": "application/octet-stream"})
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            if response.status == 404:
                raise NotFound(f"no file {path} in {self.key}")
            if response.status == 416:  # an offset at or past its end: nothing new
                return b""
            if response.status >= 400:
                raise TransferFailed(
                    f"{method} of {path} in {self.key} answered {response.status}", permanent=response.status < 500
                )
            if method != "GET":
                response.read()
                return None
            if offset and response.status != 206:  # the whole file came: skip to the offset
                skip = offset
                while skip:
                    chunk = response.read(min(skip, 1 << 20))
                    if not chunk:
                        return b""
                    skip -= len(chunk)
            return response.read(limit)
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, ssl.SSLCertVerificationError):
                raise Unreachable(
                    f"{method} of {path} in {self.key}: {exc} (set the insecure option to skip the check)",
                    permanent=True,
                ) from None
            raise Unreachable(f"{method} of {path} in {self.key}: {exc}") from None
        finally:
            conn.close()
