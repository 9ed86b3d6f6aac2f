"""Plain-HTTP helpers for tests against a live vclmgr server (sign-on flows)."""

import html
import re

import requests

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def csrf_token(html):
    """The CSRF token of a vclmgr form page."""
    return CSRF.search(html).group(1)


def local_sign_in(base_url, username, password):
    """Sign in on the login page's own form; returns (session, the page it answered with)."""
    session = requests.Session()
    page = session.get(f"{base_url}/login/", timeout=30)
    answer = session.post(
        f"{base_url}/login/",
        data={"csrfmiddlewaretoken": csrf_token(page.text), "username": username, "password": password},
        headers={"Referer": f"{base_url}/login/"},
        timeout=30,
    )
    return session, answer


def sign_on_start(session, base_url, path, label):
    """The path behind the login page's "Sign in with ``label``" button (it starts with ``path``)."""
    page = session.get(f"{base_url}/login/", timeout=30)
    button = re.search(rf'href="({re.escape(path)}[^"]*)">Sign in with {re.escape(label)}<', page.text)
    assert button, page.text
    return html.unescape(button.group(1))
