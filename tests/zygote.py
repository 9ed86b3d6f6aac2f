"""A fork server for the Django processes the tests start (job workers, daphne).

Each of those processes spends more than a second importing Django, DRF, numpy, psycopg,
openpyxl and the like before it does anything, and a run of the suite starts over a hundred of
them on two cores. The zygote imports those libraries once per test process; each start is then
a ``fork()`` of it that runs the same entry point ``python manage.py …`` or ``python -m …``
would, as the main program, in a new session, with its own environment, working directory,
output and lifeline. Nothing of Django's settings, of the app registry or of vclmgr is imported
before the fork (the settings read the child's environment, and ``PRELOAD`` is checked to leave
them unconfigured), so the child is the process its command line starts, minus the library
imports. ``libvirt`` is left out: its C library seeds its random numbers once per process.

Protocol, one Unix-socket connection per child: the test process sends a JSON request (argv,
cwd, env) with the child's output and lifeline fds attached; the zygote answers the child's pid,
then, when the child ends, its return code, and closes.
"""

import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time

from core.lifeline import pid_alive

PRELOAD = (
    "django.db.models",
    "django.contrib.admin",
    "django.contrib.postgres.fields",
    "django.forms",
    "django.http",
    "django.template",
    "django.test",
    "rest_framework.serializers",
    "django_filters.rest_framework",
    "numpy",
    "psycopg",
    "openpyxl",
    "tablib",
    "import_export.resources",
    "jwcrypto.jwk",
    "pylti1p3.message_launch",
    "pyasn1.type.univ",
    "ldap.ldapobject",
    "saml2.client",
    "channels.layers",
    "pyVmomi",
    "pycdlib",
    "passlib.hash",
    "psutil",
    "yaml",
    "cryptography.fernet",
    "redis",
    "requests",
    "prometheus_client",
    "multiprocessing.pool",
)
_HEADER = struct.Struct("!I")


def _send(sock, payload, fds=()):
    data = json.dumps(payload).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data)) + data], list(fds))


def _receive(sock, max_fds=0):
    """One message, read to its end and no further: the zygote sends a child's pid and its
    return code on one connection, and a child that ends at once sends both together."""
    header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    if not header:
        raise EOFError("the peer closed the connection")
    header += _read_exactly(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return json.loads(_read_exactly(sock, size)), fds


def _read_exactly(sock, size):
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise EOFError("the peer closed the connection mid-message")
        data += more
    return data


# --- the zygote's side ---------------------------------------------------------------------


def _entry_point(argv):
    """``argv`` (as given to ``Popen``) as a function that runs it as the main program."""
    import runpy

    if argv[1] == "-m":
        module, args = argv[2], argv[3:]

        def run():
            sys.argv = [module, *args]
            runpy.run_module(module, run_name="__main__", alter_sys=True)

    elif argv[1] == "-c":
        code, args = argv[2], argv[3:]

        def run():
            sys.argv = ["-c", *args]
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})

    else:
        script, args = argv[1], argv[2:]

        def run():
            sys.argv = [script, *args]
            runpy.run_path(script, run_name="__main__")

    return run


def _become_child(request, fds):
    """In the forked child: take on the request's session, output, environment and lifeline."""
    from core import lifeline

    output, life = fds
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(stdin)
    os.close(output)
    env = dict(request["env"])
    if lifeline.ENV in env:
        # The fd arrived under another number than the one the test process passed.
        env[lifeline.ENV] = f"{life}:{os.fstat(life).st_ino}"
    else:
        os.close(life)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    return _entry_point(request["argv"])


def serve(path, lifeline_fd):
    """Answer spawn requests on ``path`` until the test process's lifeline closes. Returns only
    in a forked child: the entry point it is to run."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS threads across fork()
    for name in PRELOAD:
        importlib.import_module(name)
    from django.conf import settings

    assert not settings.configured, "a preloaded module configured Django's settings"

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    waiting = {}  # pid → the connection that asked for it
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ, "spawn")
        selector.register(wake_read, selectors.EVENT_READ, "reap")
        selector.register(lifeline_fd, selectors.EVENT_READ, "lifeline")
        while True:
            for key, _ in selector.select():
                if key.data == "lifeline":
                    return None
                if key.data == "reap":
                    os.read(wake_read, 4096)
                    _reap(waiting)
                    continue
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn, max_fds=2)
                except (EOFError, OSError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_read, wake_write, lifeline_fd):
                        os.close(fd)
                    for sock in (listener, conn, *waiting.values()):
                        sock.close()
                    return _become_child(request, fds)
                for fd in fds:
                    os.close(fd)
                _send(conn, {"pid": pid})
                waiting[pid] = conn
            _reap(waiting)


def _reap(waiting):
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()


# --- the test process's side ---------------------------------------------------------------


class ForkedProcess:
    """What ``Child`` uses of ``subprocess.Popen``, for a child of the zygote."""

    def __init__(self, args, conn, pid):
        self.args = args
        self.pid = pid
        self.returncode = None
        self._conn = conn

    def _collect(self, timeout):
        if self._conn is None:  # the zygote is gone: only the pid is left to watch
            deadline = time.monotonic() + (timeout or 0)
            while pid_alive(self.pid):
                if timeout is not None and time.monotonic() >= deadline:
                    return
                time.sleep(0.05)
            self.returncode = -signal.SIGKILL  # (its real status went with the zygote)
            return
        self._conn.settimeout(timeout)
        try:
            answer, _ = _receive(self._conn)
        except (TimeoutError, BlockingIOError):
            return
        except (EOFError, OSError):
            self._conn.close()
            self._conn = None
            return self._collect(timeout)
        self.returncode = answer["returncode"]
        self._conn.close()
        self._conn = None

    def poll(self):
        if self.returncode is None:
            self._collect(0)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self._collect(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)


class Zygote:
    def __init__(self, root, env, directory):
        from core import lifeline

        self.path = os.path.join(directory, "zygote.sock")
        self.log = open(os.path.join(directory, "zygote.log"), "wb")  # noqa: SIM115 (closed in stop)
        read_fd, self._lifeline, _ = lifeline.open_pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.zygote", self.path, str(read_fd)],
                cwd=root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=self.log,
                start_new_session=True,
                pass_fds=(read_fd,),
            )
        finally:
            os.close(read_fd)
        if self.proc.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError(f"the zygote did not start: see {self.log.name}")

    def spawn(self, args, cwd, env, output_fd, lifeline_fd):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        _send(conn, {"argv": list(map(str, args)), "cwd": str(cwd), "env": env}, (output_fd, lifeline_fd))
        answer, _ = _receive(conn)
        return ForkedProcess(args, conn, answer["pid"])

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self._lifeline is not None:
            os.close(self._lifeline)  # the zygote returns from its loop at EOF
            self._lifeline = None
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


if __name__ == "__main__":
    run = serve(sys.argv[1], int(sys.argv[2]))
    if run is not None:
        run()
