"""The simulated guest's command channel: emulated results, never a user's command run.

A command "started" in a simulated VM is recorded on the VM row (``SimVM.guest["execs"]``)
with the moment it started and its image's ``SimExecProfile`` (or the default: one line
naming the command, exit 0, no time). Its output appears in proportion to the time passed
until the profile's ``seconds`` are up; then it has exited with the profile's status and its
``files`` are in the work directory. Files put into the guest are kept (base64) in
``SimVM.guest["files"]``; get and glob read them. Each call goes through the host's faults and
delays like every other simulator step (``guest_exec``, ``guest_exec_status``, …).
"""

import base64
import fnmatch
import posixpath
import shlex
import time

from django.db import transaction

from drivers import base
from drivers.base import ExecStatus, Invalid, NotFound
from drivers.sim.models import SimExecProfile, SimVM


def image_name(vm):
    """The image a simulated VM was made from (its staged name less the content tag)."""
    return vm.image.rsplit("-", 1)[0]


def _profile(vm, argv):
    profile = SimExecProfile.objects.filter(image=image_name(vm)).first()
    if profile is None:
        return {
            "output": base64.b64encode(f"sim: {shlex.join(argv)}\n".encode()).decode(),
            "exit_status": 0,
            "seconds": 0,
            "files": {},
        }
    output = (profile.output.encode() + bytes.fromhex(profile.output_hex)) * profile.repeat
    return {
        "output": base64.b64encode(output).decode(),
        "exit_status": profile.exit_status,
        "seconds": profile.seconds,
        "files": profile.files,
    }


def paused(state, before, after):
    """The guest's commands do not go on while it is suspended (its memory is on disk): on a
    resume their clocks move on by the time it spent suspended. Returns the guest's new state."""
    state = dict(state or {})
    if after == SimVM.State.SUSPENDED and before == SimVM.State.RUNNING:
        state["suspended_at"] = time.time()
    elif after == SimVM.State.RUNNING and "suspended_at" in state:
        away = time.time() - state.pop("suspended_at")
        state["execs"] = {tag: {**run, "started": run["started"] + away} for tag, run in state.get("execs", {}).items()}
    return state


def _running(driver, key, lock=False):
    vm = driver._vm(key, lock=lock)
    if vm.state != SimVM.State.RUNNING:
        raise base.Conflict(f"{key} is {vm.state}: the guest must be running")
    return vm


def exec_(driver, key, tag, argv, env, workdir):
    base.check_exec(tag, argv, env)
    with transaction.atomic():
        vm = _running(driver, key, lock=True)
        guest = dict(vm.guest or {})
        execs = dict(guest.get("execs", {}))
        if tag in execs:  # idempotent by tag: a retried start starts nothing
            return
        execs[tag] = {"started": time.time(), "workdir": workdir, **_profile(vm, argv)}
        guest["execs"] = execs
        SimVM.objects.filter(pk=vm.pk).update(guest=guest)


def status(driver, key, tag, offset, limit):
    vm = _running(driver, key)
    run = (vm.guest or {}).get("execs", {}).get(tag)
    if run is None:
        raise NotFound(f"no command {tag} in {key}")
    output = base64.b64decode(run["output"])
    elapsed = time.time() - run["started"]
    done = elapsed >= run["seconds"]
    if not done:
        output = output[: int(len(output) * elapsed / run["seconds"])]
    if done and run.get("files") and not run.get("left"):
        _leave_files(vm.pk, tag)
    chunk = output[offset : offset + limit]
    finished = done and offset + len(chunk) >= len(output)
    return ExecStatus(exited=finished, exit_status=run["exit_status"] if finished else None, output=chunk)


def _leave_files(vm_id, tag):
    with transaction.atomic():
        vm = SimVM.objects.select_for_update().get(pk=vm_id)
        guest = dict(vm.guest)
        run = guest["execs"][tag]
        files = dict(guest.get("files", {}))
        for name, text in run["files"].items():
            files[posixpath.join(run["workdir"], name)] = base64.b64encode(str(text).encode()).decode()
        run["left"] = True
        guest["files"] = files
        SimVM.objects.filter(pk=vm_id).update(guest=guest)


def put_file(driver, key, path, data):
    _absolute(path)
    with transaction.atomic():
        vm = _running(driver, key, lock=True)
        guest = dict(vm.guest or {})
        guest["files"] = {**guest.get("files", {}), path: base64.b64encode(data).decode()}
        SimVM.objects.filter(pk=vm.pk).update(guest=guest)


def get_file(driver, key, path, limit):
    _absolute(path)
    vm = _running(driver, key)
    encoded = (vm.guest or {}).get("files", {}).get(path)
    if encoded is None:
        raise NotFound(f"no file {path} in {key}")
    data = base64.b64decode(encoded)
    if len(data) > limit:
        raise Invalid(f"{path} in {key} is {len(data)} bytes, over the limit of {limit}")
    return data


def glob(driver, key, directory, patterns):
    _absolute(directory)
    vm = _running(driver, key)
    prefix = directory.rstrip("/") + "/"
    names = [path[len(prefix) :] for path in (vm.guest or {}).get("files", {}) if path.startswith(prefix)]
    # The shell's rule: a "*" does not cross a "/" (fnmatch's does, so compare part by part).
    return sorted({n for n in names for p in patterns if _match(n, p)})


def _match(name, pattern):
    parts, wanted = name.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, wanted, strict=True))


def _absolute(path):
    if not str(path).startswith("/"):
        raise Invalid(f"{str(path)[:100]!r} is not an absolute path in the guest")
