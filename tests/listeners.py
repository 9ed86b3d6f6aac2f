"""HTTP and TCP servers on 127.0.0.1 for the tests of outbound requests, each in a thread of the
test's process; ``Listeners.stop`` stops every one it started, ``tcp_listener`` its own. No
pytest or Django in here."""

import contextlib
import http.server
import socket
import threading


class Handler(http.server.BaseHTTPRequestHandler):
    """A request handler that logs nothing (the tests' asserts say what matters) and answers in
    one call."""

    def answer(self, status, body=b"", headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            if value:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Listeners:
    def __init__(self):
        self.started = []

    def start(self, handler, **attributes):
        """A running server of ``handler`` with ``port``, ``url`` and ``attributes`` set on it."""
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        server.port = server.server_address[1]
        server.url = f"http://127.0.0.1:{server.port}"
        for name, value in attributes.items():
            setattr(server, name, value)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.started.append((server, thread))
        return server

    def stop(self):
        for server, thread in self.started:
            server.shutdown()
            server.server_close()
            thread.join(5)


@contextlib.contextmanager
def tcp_listener(handle):
    """A TCP server on 127.0.0.1 calling ``handle(conn, stop)`` for each client, in its thread
    (``stop``: the Event set when the server stops); yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)  # so the thread sees ``stop``
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                handle(conn, stop)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()
