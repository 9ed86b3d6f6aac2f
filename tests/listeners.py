"""HTTP servers on 127.0.0.1 for the tests of outbound requests, each in a thread of the test's
process; ``Listeners.stop`` stops every one it started. No pytest or Django in here."""

import http.server
import threading


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
