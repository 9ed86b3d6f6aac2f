from datetime import UTC

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from jobs.models import Job

MAX_ID = 2**63 - 1


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO datetime, normalised to UTC: PostgreSQL refuses offsets beyond ±15:59."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError("out of range") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class JobFilterSet(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=Job.Status.choices)
    opcode = django_filters.CharFilter()
    submitter = django_filters.CharFilter(field_name="submitter__username")
    parent = django_filters.NumberFilter(field_name="parent_id", min_value=1, max_value=MAX_ID)
    retry_of = django_filters.NumberFilter(field_name="retry_of_id", min_value=1, max_value=MAX_ID)
    archived = django_filters.BooleanFilter(help_text="Archived jobs are left out unless asked for.")
    received_after = UtcIsoDateTimeFilter(field_name="received", lookup_expr="gte")
    received_before = UtcIsoDateTimeFilter(field_name="received", lookup_expr="lt")

    class Meta:
        model = Job
        fields = ["status", "opcode", "submitter", "parent", "retry_of", "archived"]
