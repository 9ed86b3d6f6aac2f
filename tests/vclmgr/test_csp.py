"""The Content-Security-Policy: strict, on every page, and nothing in our
templates that it would block (the browser check is tests/e2e/test_csp.py)."""

import re

import pytest

from tests.processes import ROOT

INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline script"),
    (re.compile(r"<style\b", re.I), "an inline <style>"),
    (re.compile(r"\sstyle=", re.I), "a style attribute"),
    (re.compile(r"\son[a-z]+=", re.I), "an inline event handler"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
]


def test_no_template_has_what_the_policy_blocks():
    found = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {what}"
        for path in sorted((ROOT / "templates").rglob("*.html"))
        for text in [path.read_text()]
        for pattern, what in INLINE
        for m in pattern.finditer(text)
    ]
    assert found == []


@pytest.mark.django_db
def test_pages_carry_a_strict_policy(client, alice):
    client.force_login(alice)
    policy = client.get("/").headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"  # the same origin's websocket too (CSP level 3)
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in policy
