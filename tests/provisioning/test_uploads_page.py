"""The images page's "Upload an image" form: the upload endpoint, the limits, the user's quota,
and its script as a static file (the Content-Security-Policy refuses inline scripts)."""

import re
from pathlib import Path

import pytest
from django.conf import settings

from provisioning.models import ImageUpload
from tests.provisioning.test_pages import page

pytestmark = pytest.mark.django_db
SCRIPT = Path(settings.BASE_DIR) / "static/js/pages/image_upload.js"


def test_the_images_page_offers_an_upload_with_the_limits_and_the_quota(client, alice, settings):
    settings.IMAGE_UPLOAD_MAX_FILE_GIB, settings.IMAGE_STORAGE_QUOTA_GIB = 7, 3
    ImageUpload.objects.create(
        id="8c1d0f7e-4d8e-4c57-9f59-3d8a2c0b6f11", owner=alice, name="x", format="raw", length=1 << 30
    )
    shown = page(client, alice, "/vms/images/")
    form = re.search(r'<form id="upload-form"[^>]*>', shown).group(0)
    assert 'data-url="/api/v1/image-uploads/"' in form and 'data-image-url="/vms/images/0/"' in form
    assert "at most 7 GiB" in shown and "use\n    1 GiB of 3 GiB" in shown
    assert "js/pages/image_upload.js" in shown and "csrfmiddlewaretoken" in shown
    assert not re.search(r"<script(?![^>]*\bsrc=)", shown)  # no inline script


def test_the_script_speaks_tus_and_resumes_from_the_servers_offset():
    script = SCRIPT.read_text()
    assert '"Tus-Resumable": "1.0.0"' in script and '"X-CSRFToken": csrf' in script
    assert 'call(url, "HEAD"' in script and "application/offset+octet-stream" in script
