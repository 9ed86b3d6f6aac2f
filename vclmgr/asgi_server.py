"""The web server: daphne, with Twisted's own parsing of POST bodies turned off.

``python -m vclmgr.asgi_server`` takes daphne's arguments. Twisted parses every multipart and
form POST itself before daphne hands the body to Django, which parses it again: each upload
costs twice, and a body Twisted cannot parse (``multipart/form-data`` without a boundary) gets
a bare 400 with no body, so an API client never learns why. With this, Django's parsers are
the one place that reads a body, and they refuse in the API's JSON error format.

A websocket's handshake gets ``CONNECT_TIMEOUT`` seconds unless ``--websocket_connect_timeout``
is given: daphne's 5 s is also autobahn's opening-handshake limit, past which the TCP connection
is dropped without an HTTP answer, and a console socket's handshake asks the database and the
hypervisor (its VNC address) before it accepts; on a loaded machine that took longer.
"""

import sys

from daphne import http_protocol
from daphne.cli import CommandLineInterface


class WebRequest(http_protocol.WebRequest):
    def __init__(self, *args, **kwargs):
        kwargs["parsePOSTFormSubmission"] = False
        super().__init__(*args, **kwargs)


CONNECT_TIMEOUT = "30"


def main():
    http_protocol.WebRequest = WebRequest  # what daphne's HTTPFactory builds each request from
    if not any(arg.startswith("--websocket_connect_timeout") for arg in sys.argv[1:]):
        sys.argv[1:1] = ["--websocket_connect_timeout", CONNECT_TIMEOUT]
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
