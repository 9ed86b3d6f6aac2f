"""A real LTI 1.3 platform for tests (an LMS as vclmgr's LTI tool meets one): its own RSA key
and JWKS, a course launch button (``/start``: the third-party login initiation to the tool), the
OIDC auth endpoint (checks the tool's auth request, answers with a page that POSTs the signed
id_token to the tool's launch URL), the OAuth2 token endpoint (checks the tool's client
assertion against the tool's JWKS) and the Names and Role Provisioning Service's memberships.

An ``http.server`` in a thread on a free loopback port, started by a fixture and stopped at its
teardown. Test code: it signs with PyJWT and checks only what the tests need."""

import contextlib
import html
import json
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

LTI = "https://purl.imsglobal.org/spec/lti/claim/"
INSTRUCTOR = "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"
LEARNER = "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"
NRPS_SCOPE = "https://purl.imsglobal.org/spec/lti-nrps/scope/contextmembership.readonly"


def new_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Platform:
    """``users``: login hint → claims (sub, email, names); ``contexts``: id → {"title", "roles":
    {login hint: [role URIs]}} (the roster is every user with roles there)."""

    client_id = "vclmgr-tool"
    deployment_id = "deployment-1"

    def __init__(self):
        self.key = new_key()
        self.kid = "platform-key-1"
        self.users, self.contexts = {}, {}
        self.tool_base = "http://testserver"  # where the tool is (the Django test client's host)
        self.tool_jwks = None  # the tool's JWKS: a dict, or its URL
        self.access_tokens, self.token_requests = set(), []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.issuer = self.url
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def registration(self, **extra):
        """The fields an administrator copies from the LMS into vclmgr."""
        return {
            "name": "Test LMS",
            "issuer": self.issuer,
            "client_id": self.client_id,
            "deployment_ids": [self.deployment_id],
            "keyset_url": f"{self.url}/jwks",
            "auth_url": f"{self.url}/auth",
            "token_url": f"{self.url}/token",
            **extra,
        }

    # --- what the LMS sends ---------------------------------------------------------------

    def initiation(self, user, context):
        """The third-party login initiation's parameters for ``user`` launching in ``context``."""
        return {
            "iss": self.issuer,
            "login_hint": user,
            "target_link_uri": f"{self.tool_base}/lti/launch/",
            "lti_message_hint": context,
            "client_id": self.client_id,
            "lti_deployment_id": self.deployment_id,
        }

    def claims(self, user, context, nonce):
        person, course = self.users[user], self.contexts[context]
        now = int(time.time())
        return {
            "iss": self.issuer,
            "aud": self.client_id,
            "azp": self.client_id,
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
            **person,
            LTI + "message_type": "LtiResourceLinkRequest",
            LTI + "version": "1.3.0",
            LTI + "deployment_id": self.deployment_id,
            LTI + "target_link_uri": f"{self.tool_base}/lti/launch/",
            LTI + "resource_link": {"id": f"link-{context}", "title": "Virtual lab"},
            LTI + "roles": course["roles"].get(user, []),
            LTI + "context": {"id": context, "title": course["title"], "type": ["CourseOffering"]},
            "https://purl.imsglobal.org/spec/lti-nrps/claim/namesroleservice": {
                "context_memberships_url": f"{self.url}/nrps/{context}",
                "service_versions": ["2.0"],
            },
        }

    def id_token(self, user, context, nonce, key=None, kid=None, **overrides):
        """A signed id_token; ``overrides`` replace claims (None removes one); ``key`` signs
        with another key."""
        body = self.claims(user, context, nonce)
        for name, value in overrides.items():
            name = name if name in body or not name.startswith("lti_") else LTI + name[4:]
            if value is None:
                body.pop(name, None)
            else:
                body[name] = value
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def authorize(self, location):
        """GET the auth URL the tool redirected to: the auto-POST form's action and fields."""
        page = requests.get(location, timeout=10)
        assert page.status_code == 200, page.text
        action = html.unescape(_FORM_ACTION(page.text))
        fields = {name: html.unescape(value) for name, value in _FIELDS(page.text)}
        return action, fields

    # --- the endpoints --------------------------------------------------------------------

    def jwks(self):
        public = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def auth(self, query):
        """The OIDC auth endpoint (LTI 1.3 §5.1.1.2): the tool's authentication request → the
        page that POSTs the id_token to its redirect_uri."""
        q = {name: values[0] for name, values in parse_qs(query).items()}
        problems = [
            q.get("scope") != "openid" and "scope",
            q.get("response_type") != "id_token" and "response_type",
            q.get("response_mode") != "form_post" and "response_mode",
            q.get("client_id") != self.client_id and "client_id",
            not str(q.get("redirect_uri", "")).startswith(self.tool_base) and "redirect_uri",
            q.get("login_hint") not in self.users and "login_hint",
            q.get("lti_message_hint") not in self.contexts and "lti_message_hint",
            not q.get("nonce") and "nonce",
        ]
        bad = [p for p in problems if p]
        if bad:
            return 400, "text/plain", f"bad authentication request: {bad}"
        token = self.id_token(q["login_hint"], q["lti_message_hint"], q["nonce"])
        page = (
            '<!doctype html><html><body onload="document.forms[0].submit()">'
            f'<form method="post" action="{html.escape(q["redirect_uri"])}">'
            f'<input type="hidden" name="id_token" value="{html.escape(token)}">'
            f'<input type="hidden" name="state" value="{html.escape(q.get("state", ""))}">'
            '<button type="submit">Continue</button></form></body></html>'
        )
        return 200, "text/html", page

    def _tool_keys(self):
        if isinstance(self.tool_jwks, str):
            return requests.get(self.tool_jwks, timeout=10).json()
        return self.tool_jwks or {"keys": []}

    def token(self, form):
        """The OAuth2 client-credentials grant with a JWT client assertion (LTI Security §4.1)."""
        f = {name: values[0] for name, values in parse_qs(form).items()}
        self.token_requests.append(f)
        if f.get("grant_type") != "client_credentials" or "client_assertion" not in f:
            return 400, "application/json", json.dumps({"error": "invalid_request"})
        kid = jwt.get_unverified_header(f["client_assertion"]).get("kid")
        keys = [k for k in self._tool_keys()["keys"] if k.get("kid") == kid]
        try:
            if not keys:
                raise jwt.InvalidTokenError(f"no tool key {kid}")
            jwt.decode(
                f["client_assertion"],
                RSAAlgorithm.from_jwk(json.dumps(keys[0])),
                algorithms=["RS256"],
                audience=f"{self.url}/token",
                issuer=self.client_id,
            )
        except jwt.InvalidTokenError as exc:
            return 401, "application/json", json.dumps({"error": "invalid_client", "error_description": str(exc)})
        token = secrets.token_urlsafe(24)
        self.access_tokens.add(token)
        body = {"access_token": token, "token_type": "Bearer", "expires_in": 3600, "scope": f.get("scope", "")}
        return 200, "application/json", json.dumps(body)

    def memberships(self, context, authorization):
        if authorization.removeprefix("Bearer ") not in self.access_tokens:
            return 401, "application/json", json.dumps({"error": "invalid_token"})
        course = self.contexts.get(context)
        if course is None:
            return 404, "application/json", "{}"
        members = [
            {
                "user_id": self.users[hint]["sub"],
                "roles": roles,
                "status": "Active",
                "email": self.users[hint].get("email", ""),
                "given_name": self.users[hint].get("given_name", ""),
                "family_name": self.users[hint].get("family_name", ""),
            }
            for hint, roles in course["roles"].items()
        ]
        body = {
            "id": f"{self.url}/nrps/{context}",
            "context": {"id": context, "title": course["title"]},
            "members": members,
        }
        return 200, "application/vnd.ims.lti-nrps.v2.membershipcontainer+json", json.dumps(body)

    def start(self, query):
        """The course's link in the LMS: the third-party login initiation (a GET redirect)."""
        q = {name: values[0] for name, values in parse_qs(query).items()}
        location = f"{self.tool_base}/lti/login/?" + urlencode(self.initiation(q["user"], q["context"]))
        return 302, location, ""


def _FORM_ACTION(text):
    import re

    return re.search(r'<form method="post" action="([^"]+)"', text).group(1)


def _FIELDS(text):
    import re

    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', text)


def _handler(platform):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status, content_type, body):
            data = body.encode()
            self.send_response(status)
            if status == 302:
                self.send_header("Location", content_type)
            else:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlsplit(self.path)
            if url.path == "/jwks":
                return self._answer(200, "application/json", json.dumps(platform.jwks()))
            if url.path == "/auth":
                return self._answer(*platform.auth(url.query))
            if url.path == "/start":
                return self._answer(*platform.start(url.query))
            if url.path.startswith("/nrps/"):
                context = url.path.removeprefix("/nrps/")
                return self._answer(*platform.memberships(context, self.headers.get("Authorization", "")))
            return self._answer(404, "text/plain", "not found")

        def do_POST(self):
            form = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            if urlsplit(self.path).path == "/token":
                return self._answer(*platform.token(form))
            return self._answer(404, "text/plain", "not found")

    return Handler


def person(sub, email, given_name, family_name):
    return {
        "sub": sub,
        "email": email,
        "given_name": given_name,
        "family_name": family_name,
        "name": f"{given_name} {family_name}",
    }


@contextlib.contextmanager
def running():
    """The platform of a test module, with its course; stopped however the module ends."""
    platform = with_course(Platform())
    try:
        yield platform
    finally:
        platform.stop()


def with_course(platform):
    """The module's platform with its people and one course: Ines teaches, Leo and Mia learn."""
    platform.users.update(
        {
            "ines": person(str(uuid.uuid4()), "ines@uni.example", "Ines", "Teacher"),
            "leo": person(str(uuid.uuid4()), "leo@uni.example", "Leo", "Student"),
            "mia": person(str(uuid.uuid4()), "mia@uni.example", "Mia", "Student"),
        }
    )
    platform.contexts["net-101"] = {
        "title": "Networks 101",
        "roles": {"ines": [INSTRUCTOR], "leo": [LEARNER], "mia": [LEARNER]},
    }
    return platform
