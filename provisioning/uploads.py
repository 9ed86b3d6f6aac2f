"""Disk images users upload: received resumably, checked, stored, and owned by the uploader.

``start`` opens an upload of ``length`` bytes (refused before any byte when the name is taken or
invalid, the format unknown, the length over ``IMAGE_UPLOAD_MAX_FILE_GIB`` or the uploader's
image-storage quota, ``IMAGE_STORAGE_QUOTA_GIB``). ``append`` writes the bytes of one request
at the upload's offset, reading the body in ``CHUNK``-sized pieces straight into the private
file ``<IMAGE_UPLOAD_DIR>/<id>.part`` (a body is never held in memory); a request cut short
keeps what arrived, so the client resumes from the offset. The file is written at the offset,
not appended, and the offset moves by a conditional UPDATE: a request run twice writes the same
bytes again. One request at a time writes an upload (a lock on the file; a second gets
``Conflict``).

When the last byte arrives the upload is ``checking`` and an ``image.upload`` job (submitted by
the uploader) runs ``finish``, which checks the file with ``disks.inspect`` (qcow2, raw) or
``disks.inspect_ova`` (an OVA's one disk, for VMware), never guessing what was declared.
Refused: the upload says why, its file is removed, no image is made. Accepted: the disk goes
to ``IMAGE_STORE_DIR`` in the form its hypervisor runs (qcow2 as it is, raw converted to
qcow2, an OVA's vmdk as streamOptimized), is checked against the quota again at its stored
size, and the image (owned by the uploader, restricted to them), its first revision
(production) and its variant are made in one transaction; a failure removes the stored file.
Both folders are read by the web processes and the workers alike: on several machines they are
shared storage.

``expire`` (a Schedule of the workers, ``tasks.expire_uploads``) removes uploads untouched for
``IMAGE_UPLOAD_EXPIRE_HOURS`` with their file, and the stored disk of an uploaded image that
was deleted; an expired upload is also removed when it is next asked for (``get_for``).
"""

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import shutil
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, Sum
from django.http import Http404, UnreadablePostError
from django.utils import timezone

from core.errors import Conflict
from core.private_files import private_dir
from drivers.base import IMAGE_NAME_RE
from jobs import services as jobs
from provisioning import disks, services
from provisioning.models import Image, ImageUpload

log = logging.getLogger(__name__)
CHUNK = 1 << 20  # bytes read from a request body at once
CONVERT_SECONDS = 3600
# The format uploaded → (hypervisor type, format stored, file suffix).
UNFINISHED = (ImageUpload.State.RECEIVING, ImageUpload.State.CHECKING)  # counted at their length
TARGETS = {"qcow2": ("kvm", "qcow2", "qcow2"), "raw": ("kvm", "qcow2", "qcow2"), "ova": ("vmware", "vmdk", "vmdk")}


class Refused(Exception):
    """The upload cannot start; ``status`` is the HTTP answer (400, 413)."""

    status = 400


class TooLarge(Refused):
    status = 413


class OffsetMismatch(Conflict):
    """The client's offset is not the upload's (it resumes from the one HEAD gives)."""


# --- where the bytes are ----------------------------------------------------------------------


def part_path(upload):
    return Path(settings.IMAGE_UPLOAD_DIR) / f"{upload.pk.hex}.part"


def stored_path(upload):
    return Path(settings.IMAGE_STORE_DIR) / f"{upload.pk.hex}.{TARGETS[upload.format][2]}"


def expires_at(upload):
    return upload.touched + timedelta(hours=settings.IMAGE_UPLOAD_EXPIRE_HOURS)


# --- quota ------------------------------------------------------------------------------------


def quota_bytes():
    return settings.IMAGE_STORAGE_QUOTA_GIB * disks.GIB


def usage(user, *, excluding=None):
    """Bytes ``user``'s uploads take: stored images that still exist, and uploads in progress
    at their announced length."""
    sums = (
        ImageUpload.objects.filter(owner=user)
        .exclude(pk=excluding)
        .aggregate(
            stored=Sum("stored_bytes", filter=Q(state=ImageUpload.State.DONE, image__isnull=False)),
            coming=Sum("length", filter=Q(state__in=UNFINISHED)),
        )
    )
    return (sums["stored"] or 0) + (sums["coming"] or 0)


def _over_quota(user, more, *, excluding=None):
    used = usage(user, excluding=excluding)
    if used + more <= quota_bytes():
        return ""
    return (
        f"your uploaded images would take {disks.size_text(used + more)}, over your image storage quota of "
        f"{disks.size_text(quota_bytes())}; delete an image you uploaded, or ask for a larger quota"
    )


# --- start, find, remove ---------------------------------------------------------------------


def start(owner, *, name, format, length):
    """A new upload of ``length`` bytes by ``owner``, or ``Refused`` / ``TooLarge``."""
    if not isinstance(name, str) or not IMAGE_NAME_RE.match(name):
        raise Refused(f"name {name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
    if format not in TARGETS:
        raise Refused(f"format {format!r}: upload qcow2, raw or ova")
    if length == 0:
        raise Refused("the file is empty")
    limit = disks.upload_limits()["max_file_bytes"]
    if length > limit:
        raise TooLarge(f"the file is {disks.size_text(length)}, over the limit of {disks.size_text(limit)}")
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()  # one start at a time
        if Image.objects.filter(name=name).exists() or _receiving(name).exists():
            raise Refused(f"an image named {name} exists already; choose another name")
        if reason := _over_quota(owner, length):
            raise TooLarge(reason)
        upload = ImageUpload.objects.create(id=uuid.uuid4(), owner=owner, name=name, format=format, length=length)
        directory = private_dir(settings.IMAGE_UPLOAD_DIR)
        os.close(os.open(directory / f"{upload.pk.hex}.part", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return upload


def _receiving(name):
    return ImageUpload.objects.filter(name=name, state__in=UNFINISHED)


def get_for(user, pk):
    """``user``'s upload ``pk`` (Http404 for anyone else's, and for an expired one, removed)."""
    upload = ImageUpload.objects.filter(pk=pk, owner=user).first() if user.is_authenticated else None
    if upload is None:
        raise Http404("No such upload.")
    if upload.state != ImageUpload.State.DONE and expires_at(upload) <= timezone.now():
        remove(upload)
        raise Http404("No such upload (it expired).")
    return upload


def remove(upload):
    """Forget an upload that made no image, with its file (the termination of an upload)."""
    if upload.state == ImageUpload.State.DONE:
        raise Conflict("the upload made an image: delete the image instead")
    if upload.state == ImageUpload.State.CHECKING and expires_at(upload) > timezone.now():
        raise Conflict("the upload is being checked; wait for it")
    part_path(upload).unlink(missing_ok=True)
    stored_path(upload).unlink(missing_ok=True)  # a check cut short may have left it
    upload.delete()


# --- receive ----------------------------------------------------------------------------------


def append(upload, offset, stream, *, actor, body_length=None):
    """Write the body ``stream`` (``body_length`` bytes if said) at ``offset``; the upload as it
    is after (``checking`` if that was its last byte). ``OffsetMismatch`` when ``offset`` is not
    where the upload is; ``TooLarge`` for a body past its length, before any byte is written."""
    if upload.state != ImageUpload.State.RECEIVING:
        raise Conflict(f"the upload is {upload.state}: it takes no more bytes")
    if body_length is not None and offset + body_length > upload.length:
        raise TooLarge(f"the body would end at byte {offset + body_length}, past the upload's {upload.length}")
    with _locked(part_path(upload)) as fd:
        upload.refresh_from_db()  # another request may have written before this one had the lock
        if offset != upload.offset or upload.state != ImageUpload.State.RECEIVING:
            raise OffsetMismatch(f"the upload is at byte {upload.offset}, not {offset}; resume from there")
        written = _receive(fd, offset, stream, upload.length - offset)
        moved = ImageUpload.objects.filter(pk=upload.pk, offset=offset, state=ImageUpload.State.RECEIVING).update(
            offset=offset + written, touched=timezone.now()
        )
    if not moved:
        raise OffsetMismatch("the upload moved on meanwhile; resume from its offset")
    upload.refresh_from_db()
    if upload.offset == upload.length:
        _check_later(upload, actor=actor)
    return upload


def _check_later(upload, *, actor):
    """The last byte is in: the upload is ``checking`` and its ``image.upload`` job queued."""
    with transaction.atomic():
        if ImageUpload.objects.filter(pk=upload.pk, state=ImageUpload.State.RECEIVING).update(
            state=ImageUpload.State.CHECKING, touched=timezone.now()
        ):
            jobs.submit("image.upload", {"upload": str(upload.pk)}, actor=actor, submitter=upload.owner)
    upload.refresh_from_db()


@contextlib.contextmanager
def _locked(path):
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        raise Conflict("the upload's file is gone; start the upload again") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict("another request is writing to this upload; wait for it") from None
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _receive(fd, offset, stream, remaining):
    """Bytes of ``stream`` written at ``offset`` (at most ``remaining``), one chunk at a time."""
    os.ftruncate(fd, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    written = 0
    while written < remaining:
        try:
            data = stream.read(min(CHUNK, remaining - written))
        except (UnreadablePostError, OSError):  # the client went away: keep what arrived
            break
        if not data:
            break
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        written += len(data)
    os.fsync(fd)
    return written


# --- finish -----------------------------------------------------------------------------------


def finish(upload, *, actor):
    """Check the complete (``checking``) upload and make its image, or refuse it (its ``reason``)."""
    source = part_path(upload)
    dest = stored_path(upload)
    try:
        try:
            info = _store(upload, source, dest)
            if reason := _over_quota(upload.owner, dest.stat().st_size, excluding=upload.pk):
                raise disks.DiskRefused(reason)
            _register(upload, info, dest, actor=actor)
        except disks.DiskRefused as exc:
            dest.unlink(missing_ok=True)
            return _refuse(upload, exc.reason)
        except disks.DiskError as exc:
            log.exception("upload %s could not be checked", upload.pk)
            dest.unlink(missing_ok=True)
            return _refuse(upload, f"the server could not check the file ({exc}); upload it again later")
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
    finally:
        source.unlink(missing_ok=True)
    return upload


def _store(upload, source, dest):
    """Check ``source`` and put its disk at ``dest`` as its hypervisor runs it: its ``DiskInfo``."""
    limits = disks.upload_limits()
    private_dir(settings.IMAGE_STORE_DIR)
    if upload.format != "ova":
        info = disks.inspect(source, declared_format=upload.format, **limits)
        if info.format == "qcow2":
            shutil.move(source, dest)
        else:
            disks.convert(source, dest, from_format=info.format, to_format="qcow2", timeout=CONVERT_SECONDS)
        return info
    ova = disks.inspect_ova(source, workdir=private_dir(settings.IMAGE_UPLOAD_DIR), **limits)
    try:
        if len(ova.disks) != 1:
            raise disks.DiskRefused(f"the OVA holds {len(ova.disks)} disks; upload an OVA of one disk")
        disk = ova.disks[0]
        if disk.info.subformat == "streamOptimized":
            shutil.move(disk.path, dest)
        else:
            disks.convert(disk.path, dest, from_format="vmdk", to_format="vmdk", timeout=CONVERT_SECONDS)
        return disk.info
    finally:
        ova.remove()


def _register(upload, info, dest, *, actor):
    """The image, its production revision and its variant, and the upload done: all or nothing."""
    hypervisor_type, fmt, _suffix = TARGETS[upload.format]
    size_gib = max(1, math.ceil(info.virtual_size / disks.GIB))
    reason = f"uploaded ({upload.format})"
    try:
        with transaction.atomic():
            image = services.create_image(
                actor=actor,
                name=upload.name,
                description=f"Uploaded by {upload.owner} ({upload.format}).",
                min_disk_gib=size_gib,
                default_disk_gib=max(size_gib, 10),
                visibility=Image.Visibility.RESTRICTED,
                owner=upload.owner,
                reason=reason,
            )
            services.add_variant(
                image,
                actor=actor,
                reason=reason,
                hypervisor_type=hypervisor_type,
                format=fmt,
                location=str(dest),
                checksum=f"sha256:{_sha256(dest)}",
                size_gib=size_gib,
            )
            done = ImageUpload.objects.filter(pk=upload.pk, state=ImageUpload.State.CHECKING).update(
                state=ImageUpload.State.DONE, image=image, stored_bytes=dest.stat().st_size, touched=timezone.now()
            )
            if not done:
                raise Conflict("the upload was finished by another request")
    except ValidationError as exc:
        raise disks.DiskRefused("; ".join(_messages(exc))) from None
    upload.refresh_from_db()


def _messages(exc):
    if hasattr(exc, "message_dict"):
        return [f"{field}: {message}" for field, messages in exc.message_dict.items() for message in messages]
    return exc.messages


def _refuse(upload, reason):
    ImageUpload.objects.filter(pk=upload.pk).update(
        state=ImageUpload.State.REFUSED, reason=reason, touched=timezone.now()
    )
    upload.refresh_from_db()
    return upload


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# --- expiry -----------------------------------------------------------------------------------


def expire(now=None):
    """Remove uploads untouched for ``IMAGE_UPLOAD_EXPIRE_HOURS`` that made no image (their
    file too), and the stored disks of uploaded images since deleted. How many of each."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.IMAGE_UPLOAD_EXPIRE_HOURS)
    stale = list(ImageUpload.objects.filter(~Q(state=ImageUpload.State.DONE), touched__lt=cutoff))
    for upload in stale:
        remove(upload)
    orphans = list(ImageUpload.objects.filter(state=ImageUpload.State.DONE, image__isnull=True))
    for upload in orphans:
        stored_path(upload).unlink(missing_ok=True)
        upload.delete()
    return {"expired": len(stale), "deleted_images": len(orphans)}
