"""``python -m vclmgr.asgi_server``'s own defaults on top of daphne's."""

import sys

from daphne.cli import CommandLineInterface

from vclmgr import asgi_server


def served_with(monkeypatch, *args):
    seen = {}

    def entrypoint():
        parsed = CommandLineInterface().parser.parse_args(sys.argv[1:])
        seen["timeout"] = parsed.websocket_connect_timeout

    monkeypatch.setattr(sys, "argv", ["asgi_server", *args, "vclmgr.asgi:application"])
    monkeypatch.setattr(CommandLineInterface, "entrypoint", staticmethod(entrypoint))
    asgi_server.main()
    return seen["timeout"]


def test_a_websocket_handshake_gets_longer_than_daphnes_five_seconds(monkeypatch):
    assert served_with(monkeypatch, "-p", "8000") == 30


def test_an_operators_own_handshake_timeout_is_kept(monkeypatch):
    assert served_with(monkeypatch, "--websocket_connect_timeout", "7") == 7
