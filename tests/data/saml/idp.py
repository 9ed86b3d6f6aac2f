"""A real SAML 2.0 identity provider for the tests: pysaml2's ``saml2.server.Server`` behind a
small WSGI app (``python tests/data/saml/idp.py DIR PORT``).

``DIR`` holds ``key.pem``/``cert.pem`` (the IdP's signing pair) and ``users.json``
(``{"name": {"password": ..., "attributes": {...}, "mode": ...}}``, read at each sign-in so a
test can change a user's affiliation). The IdP writes its metadata to ``DIR/metadata.xml``
(also served at ``/metadata``) and appends what it did to ``DIR/events.jsonl``.

An SP it does not know yet is looked up at its entity ID (the "well-known location" of
metadata), so one IdP serves every vclmgr a test module starts. Misbehaving users, for the
refusal tests: ``mode: "tamper"`` signs the assertion, then changes an attribute (the signature
no longer matches); ``mode: "other-audience"`` addresses the assertion to another SP;
``"unsigned"`` signs neither the response nor the assertion; ``"response-only"`` signs the
response but not the assertion; ``"rogue-key"`` signs both with ``DIR/rogue-key.pem``, a key
the metadata does not name (an impostor using this IdP's entity ID); ``"expired"`` answers with
an assertion that expired ten minutes ago.
"""

import base64
import copy
import html
import json
import secrets
import sys
import zlib
from pathlib import Path
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from saml2 import BINDING_HTTP_POST, BINDING_HTTP_REDIRECT
from saml2.authn_context import PASSWORD
from saml2.config import IdPConfig, SPConfig
from saml2.metadata import create_metadata_string
from saml2.saml import NAME_FORMAT_URI, NAMEID_FORMAT_TRANSIENT
from saml2.samlp import authn_request_from_string
from saml2.server import Server

OTHER_AUDIENCE = "https://other-sp.example/saml2/metadata/"


class IdP:
    def __init__(self, directory, port):
        self.dir = Path(directory)
        base = f"http://127.0.0.1:{port}"
        config = IdPConfig()
        config_dict = {
            "entityid": f"{base}/metadata",
            "xmlsec_binary": "/usr/bin/xmlsec1",
            "key_file": str(self.dir / "key.pem"),
            "cert_file": str(self.dir / "cert.pem"),
            "metadata": {},
            "service": {
                "idp": {
                    "name": "Test campus IdP",
                    "endpoints": {
                        "single_sign_on_service": [
                            (f"{base}/sso/redirect", BINDING_HTTP_REDIRECT),
                            (f"{base}/sso/post", BINDING_HTTP_POST),
                        ],
                        "single_logout_service": [(f"{base}/slo/redirect", BINDING_HTTP_REDIRECT)],
                    },
                    "name_id_format": [NAMEID_FORMAT_TRANSIENT],
                    # Shibboleth's way: attributes under their urn:oid names.
                    "policy": {"default": {"lifetime": {"minutes": 5}, "name_form": NAME_FORMAT_URI}},
                    "sign_assertion": True,
                }
            },
        }
        config.load(copy.deepcopy(config_dict))
        self.server = Server(config=config)
        self.server.metadata.load("inline", self.other_sp_metadata())
        rogue = copy.deepcopy(config_dict)
        rogue.update(key_file=str(self.dir / "rogue-key.pem"), cert_file=str(self.dir / "rogue-cert.pem"))
        expired = copy.deepcopy(config_dict)
        expired["service"]["idp"]["policy"]["default"]["lifetime"] = {"minutes": -10}
        # The servers of the misbehaving modes; every other answer is self.server's.
        self.servers = {
            mode: Server(config=IdPConfig().load(c)) for mode, c in [("rogue-key", rogue), ("expired", expired)]
        }
        self.metadata = create_metadata_string(None, config=config, valid=1).decode()
        (self.dir / "metadata.xml").write_text(self.metadata)
        self.pending = {}

    def other_sp_metadata(self):
        """Another SP this IdP serves: the audience of the "other-audience" answers."""
        config = SPConfig().load(
            {
                "entityid": OTHER_AUDIENCE,
                "xmlsec_binary": "/usr/bin/xmlsec1",
                "cert_file": str(self.dir / "cert.pem"),
                "service": {
                    "sp": {
                        "endpoints": {
                            "assertion_consumer_service": [("https://other-sp.example/acs/", BINDING_HTTP_POST)]
                        }
                    }
                },
            }
        )
        return create_metadata_string(None, config=config, valid=1).decode()

    def event(self, **fields):
        with open(self.dir / "events.jsonl", "a") as out:
            out.write(json.dumps(fields) + "\n")

    def know_sp(self, entity_id):
        known = {e for md in self.server.metadata.metadata.values() for e in md.keys()}
        if entity_id.startswith("http://127.0.0.1:") and entity_id not in known:
            self.server.metadata.load("remote", url=entity_id, cert=None)
            for server in self.servers.values():
                server.metadata.load("remote", url=entity_id, cert=None)

    # --- the endpoints -------------------------------------------------------------------
    def __call__(self, environ, start_response):
        path = environ["PATH_INFO"]
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        form = {}
        if environ["REQUEST_METHOD"] == "POST":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)).decode()
            form = {k: v[0] for k, v in parse_qs(body).items()}
        try:
            if path == "/metadata":
                return self.answer(start_response, "200 OK", self.metadata, "text/xml")
            if path == "/sso/redirect":
                return self.sso(
                    start_response, query["SAMLRequest"], query.get("RelayState", ""), BINDING_HTTP_REDIRECT
                )
            if path == "/sso/post":
                return self.sso(start_response, form["SAMLRequest"], form.get("RelayState", ""), BINDING_HTTP_POST)
            if path == "/login":
                return self.login(start_response, form)
            if path == "/slo/redirect":
                return self.slo(start_response, query)
        except Exception as exc:  # a test IdP: say what went wrong
            self.event(event="error", path=path, error=repr(exc))
            return self.answer(start_response, "400 Bad Request", f"IdP error: {exc!r}", "text/plain")
        return self.answer(start_response, "404 Not Found", "not found", "text/plain")

    def answer(self, start_response, status, body, content_type="text/html", headers=()):
        start_response(status, [("Content-Type", f"{content_type}; charset=utf-8"), *headers])
        return [body.encode()]

    def sso(self, start_response, saml_request, relay_state, binding):
        xml = base64.b64decode(saml_request)
        if binding == BINDING_HTTP_REDIRECT:
            xml = zlib.decompress(xml, -15)
        self.know_sp(authn_request_from_string(xml.decode()).issuer.text)
        request = self.server.parse_authn_request(saml_request, binding)
        key = secrets.token_urlsafe(16)
        self.pending[key] = (request.message, relay_state)
        return self.login_form(start_response, key)

    def login_form(self, start_response, key, error=""):
        page = (
            "<!doctype html><title>Campus IdP</title><h1>Campus sign-in</h1>"
            f"<p class=error>{html.escape(error)}</p>"
            '<form method="post" action="/login">'
            f'<input type="hidden" name="key" value="{key}">'
            '<label>User <input name="username"></label>'
            '<label>Password <input name="password" type="password"></label>'
            '<button type="submit">Sign in</button></form>'
        )
        return self.answer(start_response, "200 OK", page)

    def login(self, start_response, form):
        message, relay_state = self.pending[form["key"]]
        users = json.loads((self.dir / "users.json").read_text())
        user = users.get(form.get("username", ""))
        if user is None or user["password"] != form.get("password"):
            return self.login_form(start_response, form["key"], "Wrong user name or password.")
        del self.pending[form["key"]]
        args = self.server.response_args(message, [BINDING_HTTP_POST])
        mode = user.get("mode")
        if mode == "other-audience":
            args["sp_entity_id"] = OTHER_AUDIENCE
        server = self.servers.get(mode, self.server)
        response = str(
            server.create_authn_response(
                user["attributes"],
                userid=form["username"],
                authn={"class_ref": PASSWORD, "authn_auth": self.server.config.entityid},
                sign_assertion=mode not in ("unsigned", "response-only"),
                sign_response=mode != "unsigned",
                **args,
            )
        )
        if mode == "tamper":
            response = response.replace(">student<", ">faculty<")
        self.event(event="login", user=form["username"], sp=message.issuer.text)
        http = self.server.apply_binding(BINDING_HTTP_POST, response, args["destination"], relay_state, response=True)
        return self.answer(start_response, "200 OK", http["data"])

    def slo(self, start_response, query):
        request = self.server.parse_logout_request(
            query["SAMLRequest"],
            BINDING_HTTP_REDIRECT,
            relay_state=query.get("RelayState"),
            sigalg=query.get("SigAlg"),
            signature=query.get("Signature"),
        )
        message = request.message
        self.event(event="logout", sp=message.issuer.text, name_id=message.name_id.text, signed="Signature" in query)
        response = self.server.create_logout_response(message, [BINDING_HTTP_REDIRECT])
        destination = self.server.metadata.single_logout_service(message.issuer.text, BINDING_HTTP_REDIRECT, "spsso")
        http = self.server.apply_binding(
            BINDING_HTTP_REDIRECT,
            str(response),
            destination[0]["location"],
            query.get("RelayState", ""),
            response=True,
            sign=True,
        )
        location = dict(http["headers"])["Location"]
        return self.answer(start_response, "302 Found", "", headers=[("Location", location)])


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


if __name__ == "__main__":
    directory, port = sys.argv[1], int(sys.argv[2])
    app = IdP(directory, port)
    make_server("127.0.0.1", port, app, server_class=_Server, handler_class=_Quiet).serve_forever()
