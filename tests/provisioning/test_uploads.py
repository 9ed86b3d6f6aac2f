"""Image uploads over tus (``/api/v1/image-uploads/``, ``provisioning/uploads.py``) with disks
the tests build with the real qemu-img: sent in chunks, cut and resumed, checked, and made an
image owned by the uploader; refused ones say why and leave no file and no image."""

import os

import pytest

from core import periodic
from provisioning import uploads
from provisioning.models import Image, ImageUpload
from tests.provisioning.test_disks import make_ova, qcow2, qemu_img, vmdk  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db
MIB = 1 << 20
URL = "/api/v1/image-uploads/"
TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


@pytest.fixture(autouse=True)
def places(settings, tmp_path):
    settings.IMAGE_UPLOAD_DIR = tmp_path / "uploads"
    settings.IMAGE_STORE_DIR = tmp_path / "images"
    settings.IMAGE_UPLOAD_MAX_FILE_GIB = 1
    settings.IMAGE_STORAGE_QUOTA_GIB = 1
    # Small, so that a chunk of the tests is over it: the body must then be streamed.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    return settings


@pytest.fixture(autouse=True)
def jobs(sync_jobs):
    """The ``image.upload`` jobs the last bytes submit, run in this process when drained."""
    return sync_jobs


def checked(client, location, jobs):
    """What became of a complete upload: ``checking`` until its job has run."""
    assert client.get(location).json()["state"] == "checking"
    jobs.drain()
    return client.get(location).json()


def left_in(settings):
    return sorted(
        p.name for d in (settings.IMAGE_UPLOAD_DIR, settings.IMAGE_STORE_DIR) if d.exists() for p in d.iterdir()
    )


def disk_with_data(tmp_path, fmt="qcow2", size=3 * MIB):
    raw = tmp_path / "data.raw"
    raw.write_bytes(os.urandom(size))
    if fmt == "raw":
        return raw.read_bytes()
    out = tmp_path / "data.qcow2"
    qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(out))
    return out.read_bytes()


def metadata(**pairs):
    import base64

    return ",".join(f"{key} {base64.b64encode(value.encode()).decode()}" for key, value in pairs.items())


def create(client, length, name="my-disk", fmt="qcow2"):
    return client.post(URL, HTTP_UPLOAD_LENGTH=str(length), HTTP_UPLOAD_METADATA=metadata(name=name, format=fmt), **TUS)


def patch(client, location, offset, body, **extra):
    return client.generic(
        "PATCH",
        location,
        body,
        content_type="application/offset+octet-stream",
        HTTP_UPLOAD_OFFSET=str(offset),
        **TUS,
        **extra,
    )


def upload_all(client, jobs, data, name="my-disk", fmt="qcow2", chunk=MIB):
    response = create(client, len(data), name, fmt)
    assert response.status_code == 201, response.content
    location = response["Location"]
    for start in range(0, len(data), chunk):
        sent = patch(client, location, start, data[start : start + chunk])
        assert sent.status_code == 204, sent.content
    return checked(client, location, jobs)


class CutStream:
    """A request body whose connection drops after ``cut`` bytes; records each read's size."""

    def __init__(self, data, cut=None):
        self.data, self.cut, self.pos, self.reads = data, len(data) if cut is None else cut, 0, []

    def read(self, size=-1):
        self.reads.append(size)
        if self.pos >= self.cut:
            raise OSError("connection reset by peer")
        size = len(self.data) if size is None or size < 0 else size
        piece = self.data[self.pos : min(self.pos + size, self.cut)]
        self.pos += len(piece)
        return piece

    readline = read


def test_a_qcow2_sent_in_chunks_cut_and_resumed_becomes_its_uploaders_image(api, alice, bob, tmp_path, places, jobs):
    data = disk_with_data(tmp_path)
    client = api(alice)
    location = create(client, len(data))["Location"]
    assert patch(client, location, 0, data[:MIB])["Upload-Offset"] == str(MIB)
    body = data[MIB : 2 * MIB]
    cut = patch(client, location, MIB, body, **{"wsgi.input": CutStream(body, cut=300_000)})
    assert cut.status_code == 204
    offset = int(client.head(location, **TUS)["Upload-Offset"])
    assert offset == MIB + 300_000  # what arrived before the cut is kept
    assert patch(client, location, offset, data[offset:]).status_code == 204
    done = checked(client, location, jobs)
    assert done["state"] == "done", done
    image = Image.objects.get(pk=done["image"])
    assert image.owner == alice and image.name == "my-disk"
    variant = image.variants.production().get()
    assert (variant.hypervisor_type, variant.format, variant.size_gib) == ("kvm", "qcow2", 1)
    assert open(variant.location, "rb").read() == data and variant.checksum.startswith("sha256:")
    assert image in Image.objects.visible_to(alice) and image not in Image.objects.visible_to(bob)
    assert "my-disk" in [row["name"] for row in api(alice).get("/api/v1/images/").json()["results"]]
    assert left_in(places) == [os.path.basename(variant.location)]  # the partial file is gone


def test_a_raw_disk_is_stored_as_qcow2(api, alice, tmp_path, jobs):
    done = upload_all(api(alice), jobs, disk_with_data(tmp_path, "raw", 2 * MIB), fmt="raw")
    variant = Image.objects.get(pk=done["image"]).variants.get()
    assert variant.format == "qcow2" and open(variant.location, "rb").read(4) == b"QFI\xfb"


def test_an_ova_becomes_a_vmware_image(api, alice, tmp_path, vmdk, jobs):  # noqa: F811
    ovf = (
        '<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1"><References><File id="f1" href="disk.vmdk"/>'
        '</References><DiskSection><Disk diskId="d1" fileRef="f1"/></DiskSection></Envelope>'
    )
    ova = make_ova(tmp_path / "x.ova", [("x.ovf", ovf.encode()), ("disk.vmdk", vmdk)]).read_bytes()
    done = upload_all(api(alice), jobs, ova, fmt="ova")
    assert done["state"] == "done", done
    variant = Image.objects.get(pk=done["image"]).variants.get()
    assert (variant.hypervisor_type, variant.format) == ("vmware", "vmdk")


def test_a_wrong_offset_is_a_409_and_changes_nothing(api, alice):
    client = api(alice)
    location = create(client, 10)["Location"]
    assert patch(client, location, 0, b"abcd").status_code == 204
    response = patch(client, location, 2, b"xx")
    assert response.status_code == 409 and "at byte 4" in response.json()["error"]["message"]
    assert client.head(location, **TUS)["Upload-Offset"] == "4"


def test_a_body_past_the_length_is_refused_before_any_byte(api, alice):
    client = api(alice)
    location = create(client, 10)["Location"]
    response = patch(client, location, 0, b"x" * 11)
    assert response.status_code == 413 and "past the upload's 10" in response.json()["error"]["message"]
    assert client.head(location, **TUS)["Upload-Offset"] == "0"


def test_another_users_upload_is_a_404(api, alice, bob, places):
    location = create(api(alice), 10)["Location"]
    other = api(bob)
    assert other.head(location, **TUS).status_code == 404
    assert other.get(location).status_code == 404
    assert patch(other, location, 0, b"abc").status_code == 404
    assert other.delete(location, **TUS).status_code == 404
    assert ImageUpload.objects.get().offset == 0


def test_an_oversized_length_is_refused_before_any_byte(api, alice, places):
    response = create(api(alice), (1 << 30) + 1)
    assert response.status_code == 413 and "over the limit of 1 GiB" in response.json()["error"]["message"]
    assert not ImageUpload.objects.exists() and left_in(places) == []


def test_the_image_storage_quota_counts_uploads_in_progress_and_stored_images(api, alice, bob, places):
    places.IMAGE_UPLOAD_MAX_FILE_GIB = 2
    assert create(api(alice), 700 * MIB, name="first").status_code == 201
    response = create(api(alice), 400 * MIB, name="second")
    assert response.status_code == 413 and "image storage quota of 1 GiB" in response.json()["error"]["message"]
    assert create(api(bob), 400 * MIB, name="bobs").status_code == 201  # a quota per user


def test_the_quota_is_checked_again_at_the_stored_size(api, alice, tmp_path, places, jobs):
    client = api(alice)
    data = disk_with_data(tmp_path)
    location = create(client, len(data))["Location"]
    places.IMAGE_STORAGE_QUOTA_GIB = 0  # as if the quota went down while the upload ran
    patch(client, location, 0, data)
    done = checked(client, location, jobs)
    assert done["state"] == "refused" and "image storage quota" in done["reason"]
    assert not Image.objects.exists() and left_in(places) == []


def backing_etc_passwd(tmp_path):
    return qcow2(tmp_path / "evil.qcow2", "64M", "-F", "raw", "-b", "/etc/passwd", "-u").read_bytes()


def truncated(tmp_path):
    return disk_with_data(tmp_path)[: 400 * 1024]


def ova_escaping(tmp_path):
    return make_ova(tmp_path / "evil.ova", [("x.ovf", b"<Envelope/>"), ("../escape.vmdk", b"x")]).read_bytes()


@pytest.mark.parametrize(
    ("make", "fmt", "reason"),
    [
        (backing_etc_passwd, "qcow2", "backing file"),
        (truncated, "qcow2", "corrupt or truncated"),
        (ova_escaping, "ova", r"points outside the archive (..)"),
    ],
)
def test_a_bad_file_is_refused_with_its_reason_leaving_nothing(api, alice, tmp_path, places, jobs, make, fmt, reason):
    done = upload_all(api(alice), jobs, make(tmp_path), fmt=fmt)
    assert done["state"] == "refused" and reason in done["reason"], done
    assert not Image.objects.exists() and left_in(places) == []


def test_a_body_over_the_memory_limit_is_streamed_in_chunks(api, alice, places):
    client = api(alice)
    body = os.urandom(3 * MIB)
    assert len(body) > places.DATA_UPLOAD_MAX_MEMORY_SIZE
    location = create(client, len(body) + 1)["Location"]
    stream = CutStream(body)
    response = patch(client, location, 0, body, **{"wsgi.input": stream})
    assert response.status_code == 204 and response["Upload-Offset"] == str(len(body))
    assert max(stream.reads) <= uploads.CHUNK and len(stream.reads) >= len(body) // uploads.CHUNK


def test_tus_discovery_and_version(api, alice):
    client = api(alice)
    options = client.options(URL)
    assert options.status_code == 204 and options["Tus-Version"] == "1.0.0"
    assert options["Tus-Max-Size"] == str(1 << 30) and "creation" in options["Tus-Extension"]
    asked = {"HTTP_UPLOAD_LENGTH": "5", "HTTP_UPLOAD_METADATA": metadata(name="a", format="raw")}
    assert client.post(URL, **asked).status_code == 400
    response = client.post(URL, **asked, HTTP_TUS_RESUMABLE="0.2.2")
    assert response.status_code == 412 and response["Tus-Version"] == "1.0.0"
    assert not ImageUpload.objects.exists()


def test_a_name_taken_or_a_bad_format_is_refused_at_creation(api, alice, places):
    assert create(api(alice), 10, name="my-disk").status_code == 201
    assert "exists already" in create(api(alice), 10, name="my-disk").json()["error"]["message"]
    assert create(api(alice), 10, name="other", fmt="vmdk").status_code == 400
    assert create(api(alice), 10, name="../etc").status_code == 400


def test_an_abandoned_upload_expires_and_leaves_no_file(api, alice, places):
    from datetime import timedelta

    from django.utils import timezone

    client = api(alice)
    kept, dropped = create(client, 10, name="kept")["Location"], create(client, 10, name="dropped")["Location"]
    old = timezone.now() - timedelta(hours=25)
    ImageUpload.objects.update(touched=old)
    assert client.head(dropped, **TUS).status_code == 404  # removed when asked for
    ImageUpload.objects.filter(name="kept").update(touched=old)
    assert uploads.expire() == {"expired": 1, "deleted_images": 0}
    assert client.head(kept, **TUS).status_code == 404
    assert not ImageUpload.objects.exists() and left_in(places) == []


def test_a_deleted_uploaded_image_frees_its_storage(api, alice, tmp_path, places, jobs):
    done = upload_all(api(alice), jobs, disk_with_data(tmp_path, "raw", MIB), fmt="raw")
    assert uploads.usage(alice) > 0
    Image.objects.filter(pk=done["image"]).delete()
    assert uploads.usage(alice) == 0
    assert uploads.expire()["deleted_images"] == 1 and left_in(places) == []


def test_a_terminated_upload_leaves_nothing(api, alice, places):
    client = api(alice)
    location = create(client, 10)["Location"]
    assert client.delete(location, **TUS).status_code == 204
    assert not ImageUpload.objects.exists() and left_in(places) == []


def test_a_browser_session_needs_its_csrf_token(alice):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    refused = create(client, 4)
    assert refused.status_code == 403 and not ImageUpload.objects.exists()
    client.get("/vms/images/")
    token = client.cookies["csrftoken"].value
    location = create_with(client, 4, HTTP_X_CSRFTOKEN=token)["Location"]
    assert patch(client, location, 0, b"abcd", HTTP_X_CSRFTOKEN=token).status_code == 204


def create_with(client, length, **extra):
    return client.post(
        URL, HTTP_UPLOAD_LENGTH=str(length), HTTP_UPLOAD_METADATA=metadata(name="s", format="raw"), **TUS, **extra
    )


def test_workers_schedule_the_expiry(db):
    from django_q.models import Schedule

    from provisioning import tasks

    tasks.on_worker_start()
    schedule = Schedule.objects.get(name=tasks.UPLOADS_SCHEDULE)
    assert schedule.func == "provisioning.tasks.expire_uploads" and schedule.minutes == 60
    assert tasks.expire_uploads() == {"expired": 0, "deleted_images": 0}
    periodic.stop_daemon("vm-clock")
    periodic.stop_daemon("warm-pools")


def test_the_check_job_finishes_only_its_uploaders_upload(api, alice, bob, jobs):
    from jobs import services as job_services

    client = api(alice)
    location = create(client, 4, fmt="raw")["Location"]
    patch(client, location, 0, b"abcd")
    upload = ImageUpload.objects.get()
    job = job_services.submit("image.upload", {"upload": str(upload.pk)}, actor=bob)
    jobs.drain()
    job.refresh_from_db()
    assert job.status == "error" and "no such upload of yours" in job.error_message
    assert client.get(location).json()["state"] == "done"  # its own job, run in the same drain


def test_one_request_at_a_time_writes_an_upload(api, alice):
    import fcntl

    client = api(alice)
    location = create(client, 10)["Location"]
    held = os.open(uploads.part_path(ImageUpload.objects.get()), os.O_WRONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a request still streaming its body would
        response = patch(client, location, 0, b"abcd")
        assert response.status_code == 409 and "another request" in response.json()["error"]["message"]
    finally:
        os.close(held)
    assert patch(client, location, 0, b"abcd").status_code == 204
