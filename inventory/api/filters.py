"""Filters shared by the API and the inventory pages (one FilterSet per model)."""

import django_filters
from django.db.models import Q
from drf_spectacular.utils import extend_schema_field
from taggit.models import Tag

from inventory.models import BladeCenter, Credential, Hypervisor, NodeGroup


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class ByName(django_filters.ModelMultipleChoiceFilter):
    """Objects by name; repeat the parameter for several (?group=a&group=b)."""

    def __init__(self, model, **kwargs):
        super().__init__(
            field_name=f"{kwargs.pop('path')}__name", to_field_name="name", queryset=model.objects.all(), **kwargs
        )


class HypervisorFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search", max_length=100)
    group = ByName(NodeGroup, path="group", label="Node group")
    blade_center = ByName(BladeCenter, path="blade_center", label="Blade center")
    credential = ByName(Credential, path="credential", label="Credential")
    state = django_filters.MultipleChoiceFilter(choices=Hypervisor.State.choices)
    driver = django_filters.MultipleChoiceFilter(choices=Hypervisor.Driver.choices)
    tag = ByName(Tag, path="tags", conjoined=True, label="Tags (all of)")

    class Meta:
        model = Hypervisor
        fields = ["q", "group", "blade_center", "credential", "state", "driver", "tag"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(address__icontains=value))


class BladeCenterFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(lookup_expr="iexact", max_length=100)

    class Meta:
        model = BladeCenter
        fields = ["site"]


class NodeGroupFilterSet(django_filters.FilterSet):
    alloc_policy = django_filters.ChoiceFilter(choices=NodeGroup.AllocPolicy.choices)

    class Meta:
        model = NodeGroup
        fields = ["alloc_policy", "exclusive_storage"]


class CredentialFilterSet(django_filters.FilterSet):
    class Meta:
        model = Credential
        fields = ["username"]
