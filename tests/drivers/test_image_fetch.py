"""An image's http(s):// location is downloaded under the outbound policy: an internal address
is refused before any connection unless VCLMGR_OUTBOUND_ALLOW names it, a redirect's target is
checked the same way, and the download has a deadline and a size limit. The only servers are
127.0.0.1 listeners started here; ``connects`` records every connection attempt."""

import hashlib
import time

import pytest

from core import outbound
from drivers import base
from tests.listeners import Handler, Listeners

BODY = b"qcow2 bytes of a test image\n" * 100
CHECKSUM = "sha256:" + hashlib.sha256(BODY).hexdigest()


class _Images(Handler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.hits.append(self.path)
        if self.path.startswith("/moved-to/"):
            self.answer(302, headers={"Location": self.path.removeprefix("/moved-to")})
        elif self.path.startswith("/moved-away/"):
            self.answer(302, headers={"Location": "http://" + self.path.removeprefix("/moved-away/")})
        elif self.path == "/image.qcow2":
            self.answer(200, BODY)
        elif self.path == "/unsized":  # no Content-Length: the end is when the connection closes
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(BODY)
            self.close_connection = True
        elif self.path == "/trickle":
            self.send_response(200)
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
        else:
            self.answer(404)


@pytest.fixture
def images():
    listeners = Listeners()
    yield listeners.start(_Images, hits=[])
    listeners.stop()


def spec(location, checksum=CHECKSUM):
    return base.ImageVariantSpec(name="img", format="qcow2", location=location, checksum=checksum, size_gib=1)


def test_an_allow_listed_server_serves_the_image_through_a_redirect(images, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    with base.fetched(spec(f"{images.url}/moved-to/image.qcow2")) as path, open(path, "rb") as copy:
        assert copy.read() == BODY
    assert images.hits == ["/moved-to/image.qcow2", "/image.qcow2"]
    assert set(connects) == {"127.0.0.1"}


@pytest.mark.parametrize("host", ["127.0.0.1", "169.254.169.254", "10.0.0.1", "localhost", "0x7f000001"])
def test_an_internal_address_is_refused_before_any_connection(host, images, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []  # the production default
    with pytest.raises(base.Invalid, match="is not allowed: .*VCLMGR_OUTBOUND_ALLOW"):
        with base.fetched(spec(f"http://{host}:{images.port}/image.qcow2")):
            pass
    assert connects == [] and images.hits == []


def test_a_redirect_to_an_internal_address_is_refused_before_connecting_to_it(images, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    with pytest.raises(base.Invalid, match="10.0.0.1 is not a public address"):
        with base.fetched(spec(f"{images.url}/moved-away/10.0.0.1/image.qcow2")):
            pass
    assert connects == ["127.0.0.1"]


def test_a_trickling_server_is_cut_off_at_the_deadline(images, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    settings.VCLMGR_IMAGE_FETCH_TIMEOUT = 1
    began = time.monotonic()
    with pytest.raises(base.Unreachable, match="timed out after 1 s"):
        with base.fetched(spec(f"{images.url}/trickle", checksum="")):
            pass
    assert time.monotonic() - began < 3


def test_a_missing_image_is_not_found(images, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    with pytest.raises(base.NotFound, match="answered 404"):
        with base.fetched(spec(f"{images.url}/gone.qcow2")):
            pass


def test_a_download_over_its_size_limit_stops(images, settings, tmp_path):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    with open(tmp_path / "out", "wb") as out, pytest.raises(outbound.TooLarge, match="more than the limit of 100"):
        outbound.download(f"{images.url}/image.qcow2", out, timeout=5, max_bytes=100)
    with open(tmp_path / "out", "wb") as out, pytest.raises(outbound.TooLarge, match="more than the limit of 100 b"):
        outbound.download(f"{images.url}/unsized", out, timeout=5, max_bytes=100)
