"""API exceptions that parsers raise too (kept apart from errors.py, which imports DRF's views,
which import the parsers)."""

from rest_framework import status
from rest_framework.exceptions import APIException


class TooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"
    default_detail = "Request too large."
