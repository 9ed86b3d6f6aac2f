"""``manage.py serve``: the ASGI server and the job workers, together, as one command.

A small supervisor: it starts daphne (HTTP, websockets, static files) and django-q2's
cluster as child processes (forking a worker pool inside an event loop is asking for
trouble), streams their output, and stops both on Ctrl-C or SIGTERM. If either child
dies, the other is stopped too and serve exits non-zero, so a process manager restarts
the pair.
"""

import os
import signal
import socket
import subprocess
import sys
import time

from django.core.management.base import BaseCommand, CommandError

GRACE_SECONDS = 10


def port_is_free(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class Command(BaseCommand):
    help = "Run the web/API/websocket server and the job workers together."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=None, help="job worker processes")
        parser.add_argument("--no-workers", action="store_true", help="serve only (workers run elsewhere)")

    def handle(self, *args, host, port, workers, no_workers, **options):
        if not 0 < port < 65536:
            raise CommandError(f"--port must be between 1 and 65535, got {port}")
        if workers is not None and workers < 1:
            raise CommandError("--workers must be at least 1")
        if not port_is_free(host, port):
            raise CommandError(f"{host}:{port} is busy: another process is listening there (choose --port)")
        env = dict(os.environ)
        if workers:
            env["VCLMGR_WORKERS"] = str(workers)
        web = [sys.executable, "-m", "vclmgr.asgi_server", "-b", host, "-p", str(port), "vclmgr.asgi:application"]
        commands = {"web": web}
        if not no_workers:
            commands["workers"] = [sys.executable, "manage.py", "qcluster"]
        children = {
            name: subprocess.Popen(cmd, env=env, start_new_session=True) for name, cmd in commands.items()
        }
        self.stdout.write(f"vclmgr serving on http://{host}:{port}/ (pids: "
                          + ", ".join(f"{n} {p.pid}" for n, p in children.items()) + ")")
        self.stdout.flush()
        stopping = []

        def request_stop(signum, frame):
            stopping.append(signum)

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        exit_code = 0
        while not stopping:
            dead = [name for name, child in children.items() if child.poll() is not None]
            if dead:
                self.stderr.write(f"{dead[0]} process exited with status {children[dead[0]].returncode}; stopping")
                exit_code = 1
                break
            time.sleep(0.2)
        self._stop(children)
        if exit_code:
            raise CommandError("a child process died")

    def _stop(self, children):
        for child in children.values():
            if child.poll() is None:
                # The leader only: qcluster stops its own pool in order; signalling the
                # whole group at once leaves its sentinel waiting on dead workers.
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in children.values():
            # Whatever is left in a child's session (a stuck worker) goes now.
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
