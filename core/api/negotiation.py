"""Content negotiation for endpoints whose ``?format=`` is a filter, not a choice of renderer."""

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.settings import api_settings


class _WithoutFormatOverride:
    URL_FORMAT_OVERRIDE = None

    def __getattr__(self, name):
        return getattr(api_settings, name)


class FormatIsAFilter(DefaultContentNegotiation):
    """DRF reads ``?format=qcow2`` as "render as qcow2" and answers 404 when no renderer has
    that name; here the parameter filters the list (the Accept header still chooses)."""

    settings = _WithoutFormatOverride()
