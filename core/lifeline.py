"""Children that die with their supervisor, however it dies (``serve``'s process tree).

Two mechanisms, because each alone leaves a gap:

* ``preexec(parent_pid)`` for ``subprocess.Popen(preexec_fn=…)``: the kernel sends the child
  SIGTERM when the thread that forked it ends (``PR_SET_PDEATHSIG``). It is cleared by
  ``fork()``, so it does not reach grandchildren (qcluster's sentinel, workers, monitor).
* A lifeline pipe: the supervisor keeps the only write end (``open_pipe``); every process of
  the tree inherits the read end (``child_env`` names it; ``Popen(pass_fds=…)`` passes it) and
  watches it from a daemon thread (``watch``, started by the core app in every Django
  process, and again in every forked child through ``os.register_at_fork``). When the
  supervisor dies the kernel closes the write end, every reader sees EOF, stops itself with
  SIGTERM and, if that has not ended it within ``GRACE_SECONDS``, exits hard.

The pipe is named by fd *and* inode: a process that closed the inherited fd (``subprocess``
closes fds by default) must not mistake an unrelated file that reuses the number for it.
"""

import ctypes
import logging
import os
import signal
import stat
import threading
import time

log = logging.getLogger(__name__)
ENV = "VCLMGR_LIFELINE"
GRACE_SECONDS = 3.0
PR_SET_PDEATHSIG = 1
_watching = {"pid": None}


def pid_alive(pid):
    """Is process ``pid`` alive (a process of another user's counts: it exists)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_pipe():
    """``(read_fd, write_fd, env_value)``: the supervisor keeps ``write_fd`` open, passes ``read_fd``."""
    read_fd, write_fd = os.pipe()  # both non-inheritable: only pass_fds hands read_fd on
    return read_fd, write_fd, f"{read_fd}:{os.fstat(read_fd).st_ino}"


def preexec(parent_pid):
    """A ``preexec_fn`` that asks for SIGTERM when the parent dies (and exits if it already has)."""

    def set_deathsig():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            os._exit(70)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(70)

    return set_deathsig


def _pipe_fd(value):
    """The inherited read end named by ``value`` (``fd:inode``), or None if this process lacks it."""
    try:
        fd, inode = (int(part) for part in value.split(":"))
        info = os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd if stat.S_ISFIFO(info.st_mode) and info.st_ino == inode else None


def watch():
    """Start the watcher thread in this process if it belongs to a supervised tree (idempotent)."""
    value = os.environ.get(ENV)
    if not value or _watching["pid"] == os.getpid():
        return
    fd = _pipe_fd(value)
    if fd is None:
        return
    _watching["pid"] = os.getpid()
    if not _watching.get("fork_hook"):
        _watching["fork_hook"] = True
        os.register_at_fork(after_in_child=watch)  # threads do not survive fork: start one again
    threading.Thread(target=_wait_for_eof, args=(fd,), name="lifeline", daemon=True).start()


def _wait_for_eof(fd):
    try:
        while os.read(fd, 1):  # nobody writes: read returns b"" once the supervisor is gone
            pass
    except OSError:
        return
    log.warning("supervisor gone: stopping process %s", os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(70)
