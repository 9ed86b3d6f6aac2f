"""A silent peer: a TCP listener on 127.0.0.1 that accepts every connection, reads what it is
sent and never writes a byte — a hung daemon, or a host that holds connections on purpose.
Every outside call's timeout is tested against one. Stopped by ``close()`` (or the ``with``
block's end), which also closes the connections it holds."""

import socket
import threading


class SilentPeer:
    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.received = 0  # bytes the clients sent: proof they connected and spoke
        self._held = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-peer", daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stopping.is_set():
            try:
                conn, _ = self.listener.accept()
                conn.setblocking(False)
                self._held.append(conn)
                self.accepted += 1
            except TimeoutError:
                pass
            except OSError:
                return
            for conn in self._held:
                try:
                    self.received += len(conn.recv(65536))
                except (BlockingIOError, OSError):
                    pass

    def close(self):
        self._stopping.set()
        self._thread.join(5)
        self.listener.close()
        for conn in self._held:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()


def outcome_within(seconds, fn, *args, **kwargs):
    """``(result, exception, elapsed)`` of ``fn(...)``, run in a daemon thread; fails the test
    if it is still running after ``seconds`` (an unbounded hang fails instead of hanging the run)."""
    import time

    import pytest

    box = {}

    def run():
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            box["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, name="under-test", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(fn, '__qualname__', fn)} still waits after {seconds} s: no timeout bounds it")
    return box.get("result"), box.get("error"), time.monotonic() - started


def wait_for(predicate, what, seconds=10):
    import time

    import pytest

    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        time.sleep(0.02)


class FallingSilent:
    """A TCP listener on 127.0.0.1 relaying each connection to the Unix socket ``target`` (a real
    daemon) until ``silence()``; from then on it reads what either side sends and passes nothing
    on — a peer that answered at first and then hung. Stopped by ``close()``."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.silent = threading.Event()
        self._sockets = [self.listener]
        self._threads = [threading.Thread(target=self._accept, name="falling-silent", daemon=True)]
        self._threads[0].start()

    def silence(self):
        self.silent.set()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            daemon = socket.socket(socket.AF_UNIX)
            daemon.connect(self.target)
            self._sockets += [client, daemon]
            for source, sink in ((client, daemon), (daemon, client)):
                thread = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source, sink):
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    return
                if not self.silent.is_set():
                    sink.sendall(data)
            except OSError:
                return

    def close(self):
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()
