"""Image uploads over the tus 1.0 protocol (core, creation, expiration, termination).

``POST /api/v1/image-uploads/`` with ``Upload-Length`` and ``Upload-Metadata`` (``name``,
``format``: qcow2, raw or ova) opens an upload (201, ``Location``); ``HEAD`` on it gives
``Upload-Offset``; ``PATCH`` with ``Upload-Offset`` and ``Content-Type:
application/offset+octet-stream`` appends its body (204, the new ``Upload-Offset``; 409 when
the offset is not the upload's). ``GET`` (not tus) says what became of it: its ``state``, the
``reason`` of a refusal, its ``image``. ``DELETE`` drops an unfinished one.

Tokens and browser sessions both authenticate (a session's write needs its CSRF token header,
as everywhere in the API). The body is never parsed: ``request.stream`` is read in chunks by
``uploads.append``; nothing here touches ``request.data``. Another user's upload is a 404.
"""

import base64
import binascii

from django.utils.http import http_date
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ParseError
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import error_body
from provisioning import disks, uploads
from provisioning.models import ImageUpload

VERSION = "1.0.0"
OFFSET_TYPE = "application/offset+octet-stream"
TUS_ONLY = OpenApiResponse(description="tus headers only (Upload-Offset, Upload-Length, Location)")
CONFLICT = OpenApiResponse(description="The Upload-Offset is not the upload's, or it takes no more bytes")
TOO_LARGE = OpenApiResponse(description="Over the file size limit or the image storage quota")
NOT_TUS = OpenApiResponse(description="Not tus 1.0.0 (the Tus-Resumable header)")


class ImageUploadSerializer(serializers.ModelSerializer):
    expires = serializers.SerializerMethodField()

    class Meta:
        model = ImageUpload
        fields = ["id", "name", "format", "length", "offset", "state", "reason", "image", "created", "expires"]
        read_only_fields = fields

    def get_expires(self, upload) -> str | None:
        return uploads.expires_at(upload).isoformat() if upload.state == ImageUpload.State.RECEIVING else None


class TusView(APIView):
    """What every tus endpoint shares: the version check, the headers, the refusals' answers."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.method in ("GET", "OPTIONS") or not hasattr(self, request.method.lower()):
            return  # not tus (an unknown method: DRF answers 405)
        version = request.headers.get("Tus-Resumable")
        if version is None:
            raise ParseError(f"Tus-Resumable: {VERSION} is required")
        if version != VERSION:
            raise _Unsupported()

    def handle_exception(self, exc):
        if isinstance(exc, uploads.Refused):
            code = "too_large" if exc.status == 413 else "invalid"
            return Response(error_body(exc.status, code, str(exc)), status=exc.status)
        if isinstance(exc, _Unsupported):
            response = Response(error_body(412, "precondition_failed", f"tus {VERSION} only"), status=412)
            response["Tus-Version"] = VERSION
            return response
        return super().handle_exception(exc)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Tus-Resumable"] = VERSION
        response["Cache-Control"] = "no-store"
        return response


class _Unsupported(Exception):
    pass


class ImageUploadsView(TusView):
    @extend_schema(
        request=None,
        responses={201: TUS_ONLY, 412: NOT_TUS, 413: TOO_LARGE},
    )
    def post(self, request):
        """Open an upload (tus creation): headers ``Tus-Resumable: 1.0.0``, ``Upload-Length`` (bytes)
        and ``Upload-Metadata`` (``name <base64>,format <base64>``: qcow2, raw or ova)."""
        metadata = parse_metadata(request.headers.get("Upload-Metadata", ""))
        upload = uploads.start(
            request.user,
            name=metadata.get("name", ""),
            format=metadata.get("format", ""),
            length=_header_int(request, "Upload-Length"),
        )
        response = Response(status=status.HTTP_201_CREATED)
        response["Location"] = request.build_absolute_uri(f"{request.path}{upload.pk}/")
        response["Upload-Offset"] = "0"
        response["Upload-Expires"] = http_date(uploads.expires_at(upload).timestamp())
        return response

    @extend_schema(exclude=True)
    def options(self, request, *args, **kwargs):
        response = Response(status=status.HTTP_204_NO_CONTENT)
        response["Tus-Version"] = VERSION
        response["Tus-Extension"] = "creation,expiration,termination"
        response["Tus-Max-Size"] = str(disks.upload_limits()["max_file_bytes"])
        return response


class ImageUploadView(TusView):
    @extend_schema(responses={200: ImageUploadSerializer})
    def get(self, request, pk):
        """What became of the upload: receiving, done (its ``image``) or refused (the ``reason``)."""
        return Response(ImageUploadSerializer(uploads.get_for(request.user, pk)).data)

    @extend_schema(exclude=True)
    def head(self, request, pk):
        return _offset_response(uploads.get_for(request.user, pk), status.HTTP_200_OK)

    @extend_schema(
        request=None,
        responses={204: TUS_ONLY, 409: CONFLICT, 412: NOT_TUS, 413: TOO_LARGE},
    )
    def patch(self, request, pk):
        """Append the body at ``Upload-Offset`` (headers ``Tus-Resumable: 1.0.0``, ``Upload-Offset``,
        ``Content-Type: application/offset+octet-stream``)."""
        upload = uploads.get_for(request.user, pk)
        if request.content_type != OFFSET_TYPE:
            response = Response(error_body(415, "unsupported_media_type", f"send {OFFSET_TYPE}"), status=415)
            return response
        offset = _header_int(request, "Upload-Offset")
        length = request.META.get("CONTENT_LENGTH") or None
        body_length = int(length) if length and length.isdigit() else None
        upload = uploads.append(upload, offset, request.stream, actor=request.user, body_length=body_length)
        return _offset_response(upload, status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={204: None, 409: CONFLICT, 412: NOT_TUS})
    def delete(self, request, pk):
        """Drop an unfinished upload and its bytes (header ``Tus-Resumable: 1.0.0``)."""
        uploads.remove(uploads.get_for(request.user, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _offset_response(upload, code):
    response = Response(status=code)
    response["Upload-Offset"] = str(upload.offset)
    response["Upload-Length"] = str(upload.length)
    response["Upload-State"] = upload.state
    if upload.state == ImageUpload.State.RECEIVING:
        response["Upload-Expires"] = http_date(uploads.expires_at(upload).timestamp())
    return response


def _header_int(request, name):
    value = request.headers.get(name, "")
    if not value.isdigit() or not value.isascii():
        raise ParseError(f"{name}: a non-negative integer is required")
    return int(value)


def parse_metadata(header):
    """tus ``Upload-Metadata``: comma-separated ``key base64(value)`` pairs → a dict of text."""
    pairs = {}
    for item in filter(None, (part.strip() for part in header.split(","))):
        key, _, encoded = item.partition(" ")
        try:
            pairs[key] = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ParseError(f"Upload-Metadata: the value of {key!r} is not base64 of UTF-8 text") from None
    return pairs
