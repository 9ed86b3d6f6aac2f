"""``image.upload``: a complete upload checked and made its uploader's image (``uploads.finish``).

Submitted by the request that brought the upload's last byte: the check (``qemu-img check``
reads every table of the image), a conversion and the checksum take too long for a request.
Only the uploader's own upload is finished (also through the generic jobs API). Run again, it
answers what the first run decided.
"""

from jobs.registry import opcode
from provisioning import uploads
from provisioning.models import ImageUpload
from provisioning.opcodes.common import Refused
from provisioning.opcodes.params import UploadParams, upload_locks


@opcode("image.upload", params=UploadParams, locks=upload_locks, staff_only=False)
def image_upload(job):
    """Check an uploaded disk and make it its uploader's image, or refuse it with the reason."""
    upload = ImageUpload.objects.filter(pk=job.params["upload"]).first()
    if upload is None or upload.owner_id != job.job.submitter_id:
        raise Refused("no such upload of yours")
    job.expect(1)
    return job.step("check", check, str(upload.pk), actor=job.actor)


def check(upload_id, *, actor):
    upload = ImageUpload.objects.select_related("owner").get(pk=upload_id)
    if upload.state == ImageUpload.State.CHECKING:
        upload = uploads.finish(upload, actor=actor)
    return {"state": upload.state, "image": upload.image_id, "reason": upload.reason}
