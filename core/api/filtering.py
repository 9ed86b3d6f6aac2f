"""The API's django-filter backend: a boolean filter given anything but true/false is a 400, and
filters apply to lists only.

django-filter reads ``?active=maybe`` as "no filter" and answers the whole list, so a typo
silently widens the answer; the schema says boolean, and the API holds to it.
"""

from django_filters import BooleanFilter
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ValidationError

BOOLEANS = {"true", "false", "True", "False", "1", "0"}


class FilterBackend(DjangoFilterBackend):
    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is not None:
            bad = {
                name: ["must be true or false"]
                for name, declared in filterset.filters.items()
                if isinstance(declared, BooleanFilter)
                and any(value not in BOOLEANS for value in request.query_params.getlist(name) if value != "")
            }
            if bad:
                raise ValidationError(bad)
        return filterset

    def filter_queryset(self, request, queryset, view):
        # A filter narrows a list; on one object's route (``/vms/5/``) the schema documents no
        # filter, and building the filter set there cost every detail request for nothing.
        lookup = getattr(view, "lookup_url_kwarg", None) or getattr(view, "lookup_field", None)
        if lookup and lookup in getattr(view, "kwargs", {}):
            return queryset
        return super().filter_queryset(request, queryset, view)
