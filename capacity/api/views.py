from datetime import UTC, datetime

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import access
from capacity import loaders, preemption, services
from capacity.api.serializers import PlanRequestSerializer, PlanResultSerializer
from capacity.durations import parse_moment


def demand_from(data):
    start = data.get("start") or parse_moment("now")
    duration = data.get("duration")
    formats, types = data.get("formats"), data.get("hypervisors")
    return services.Demand(
        vcpus=data["vcpus"],
        memory_mib=data["memory_mib"],
        disk_gib=data.get("disk_gib", 0),
        start=start,
        end=start + duration if duration else None,
        hypervisors=frozenset(types) if types is not None else loaders.hypervisor_types_for(formats),
        image=data.get("image", ""),
        required_tags=frozenset(data.get("required_tags", ())),
        forbidden_tags=frozenset(data.get("forbidden_tags", ())),
        anti_affinity=data.get("anti_affinity", ""),
        exclusive_storage=data.get("exclusive_storage", False),
        policy=data.get("policy"),
        groups=frozenset(data["groups"]) if data.get("groups") else None,
        rank=preemption.rank(data.get("priority") or ("" if data.get("start") else settings.RESERVATION_PRIORITY)),
    )


def plan_payload(result, staff):
    """The answer as the API shows it; host names are for administrators only."""
    fit = result.earliest_fit
    earliest = None
    if fit is not None:
        earliest = {
            "start": datetime.fromtimestamp(fit.start, UTC) if fit.start is not None else None,
            "host": fit.host if staff else None,
            "summary": str(fit),
        }
    suspend = services.preemption_note(result)
    return {
        "fits": result.ok,
        "host": result.host if staff else None,
        "policy": result.policy,
        "summary": (str(result) + (f"; {suspend}" if suspend else "")) if (staff or not result.ok) else "fits",
        "suspend": suspend,
        "reasons": dict(result.reasons),
        "closest_misses": [m.to_dict() for m in result.closest_misses] if staff else [],
        "earliest_fit": earliest,
    }


class PlanView(APIView):
    """Where would this VM go? A dry run of placement: nothing is claimed."""

    @extend_schema(request=PlanRequestSerializer, responses=PlanResultSerializer)
    def post(self, request):
        serializer = PlanRequestSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        result = services.plan(demand_from(serializer.validated_data))
        return Response(PlanResultSerializer(plan_payload(result, access.can(request.user, "see_cluster"))).data)
