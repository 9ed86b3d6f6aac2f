"""``manage.py serve [--role web|worker|all]``: the ASGI server and/or the job workers.

A small supervisor: it starts daphne (HTTP, websockets, static files; role ``web``) and
django-q2's cluster (role ``worker``) as child processes (forking a worker pool inside an
event loop is asking for trouble), streams their output, and stops them on Ctrl-C or
SIGTERM. ``all`` (the default) runs both: one machine. If a child dies, the others are
stopped too and serve exits non-zero, so a process manager restarts the set.

Its children never outlive it, however it dies (SIGKILL included): each gets SIGTERM from
the kernel when the supervisor dies, and every process of the tree, grandchildren too,
watches a lifeline pipe only the supervisor can hold open (``core.lifeline``).

It keeps ``PROMETHEUS_MULTIPROC_DIR`` as prometheus_client asks: cleared when it starts (before
any child), and each child that ends, killed or not, forgotten (its live gauges go, so a pid
given again never counts a dead daphne's websockets); see ``core.metrics``.
"""

import os
import signal
import socket
import subprocess
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from core import lifeline, metrics

GRACE_SECONDS = 10
ROLES = ("all", "web", "worker")


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
    help = "Run the web/API/websocket server (role web), the job workers (role worker), or both (all)."

    def add_arguments(self, parser):
        parser.add_argument("--role", choices=ROLES, default="all", help="what this machine runs (default: all)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=None, help="job worker processes")
        parser.add_argument("--no-workers", action="store_true", help="the same as --role web")

    def handle(self, *args, role, host, port, workers, no_workers, **options):
        if no_workers:
            if role == "worker":
                raise CommandError("--no-workers contradicts --role worker")
            role = "web"
        if not 0 < port < 65536:
            raise CommandError(f"--port must be between 1 and 65535, got {port}")
        if workers is not None and workers < 1:
            raise CommandError("--workers must be at least 1")
        if role != "worker" and not port_is_free(host, port):
            raise CommandError(f"{host}:{port} is busy: another process is listening there (choose --port)")
        self.metrics_lock = metrics.claim_directory()  # held (shared) while serve runs
        read_fd, write_fd, lifeline_env = lifeline.open_pipe()
        env = {**os.environ, lifeline.ENV: lifeline_env}
        if workers:
            env["VCLMGR_WORKERS"] = str(workers)
        commands = {}
        if role in ("all", "web"):
            commands["web"] = [
                sys.executable,
                "-m",
                "vclmgr.asgi_server",
                "-b",
                host,
                "-p",
                str(port),
                "vclmgr.asgi:application",
            ]
        if role in ("all", "worker"):
            commands["workers"] = [sys.executable, "manage.py", "qcluster"]
        children = {
            name: subprocess.Popen(
                cmd, env=env, start_new_session=True, pass_fds=(read_fd,), preexec_fn=lifeline.preexec(os.getpid())
            )
            for name, cmd in commands.items()
        }
        os.close(read_fd)  # the children hold it; write_fd stays open as long as this process lives
        pids = ", ".join(f"{name} {child.pid}" for name, child in children.items())
        where = f" on http://{host}:{port}/" if "web" in children else ""
        self.stdout.write(f"vclmgr {role} serving{where} (pids: {pids})")
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
        os.close(write_fd)
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
            metrics.forget(child.pid)  # killed, it ran no exit handler of its own
        metrics.forget_dead_processes()  # qcluster's pool, stopped with it
