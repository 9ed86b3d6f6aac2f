"""``/api/v1/plans/``: move plans (staff only). POST computes one (a dry run); ``execute`` runs
it as jobs (409 when stale, unless ``recompute``; 409 when executed already); ``cancel``."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.api.permissions import OperatorOrAuditor
from core.api.serializers import RefuseUnknownFields
from provisioning import plans
from provisioning.models import Plan


class PlanSerializer(serializers.ModelSerializer):
    class Meta:
        model = Plan
        fields = [
            "id",
            "kind",
            "state",
            "target",
            "options",
            "reason",
            "rate_limit",
            "score_before",
            "score_after",
            "moves",
            "power_off",
            "power_on",
            "claims",
            "utilisation",
            "notes",
            "jobs",
            "created",
            "created_by",
            "executed",
            "finished",
        ]
        read_only_fields = fields


class PlanCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    kind = serializers.ChoiceField(choices=Plan.Kind.values)
    target = serializers.CharField(max_length=100, required=False, default="", help_text="node or group to evacuate")
    group = serializers.CharField(max_length=100, required=False, allow_null=True, default=None)
    reason = serializers.CharField(max_length=1000, required=False, default="")
    rate_limit = serializers.IntegerField(min_value=1, max_value=10000, required=False, allow_null=True, default=None)
    max_moves = serializers.IntegerField(min_value=-1, required=False, default=-1)


class ExecuteSerializer(RefuseUnknownFields, serializers.Serializer):
    recompute = serializers.BooleanField(required=False, default=False)


class PlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = PlanSerializer
    permission_classes = [OperatorOrAuditor]

    def get_queryset(self):
        return plans.visible_to(self.request.user)

    def get_object(self):
        return plans.refresh(super().get_object())

    @extend_schema(request=PlanCreateSerializer, responses={201: PlanSerializer})
    def create(self, request):
        """Compute a plan on the cluster as it is now (nothing moves yet)."""
        data = _valid(PlanCreateSerializer, request.data)
        options = {"max_moves": data["max_moves"]} if data["max_moves"] != -1 else {}
        plan = plans.compute(
            data["kind"],
            actor=request.user,
            target=data["target"],
            group=data["group"],
            reason=data["reason"],
            rate_limit=data["rate_limit"],
            options=options,
        )
        return Response(PlanSerializer(plan).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ExecuteSerializer, responses={202: PlanSerializer})
    @action(detail=True, methods=["post"])
    def execute(self, request, pk=None):
        """Submit the plan's jobs; 409 with the reasons when the plan is stale (or ran already)."""
        data = _valid(ExecuteSerializer, request.data)
        plan = plans.execute(self.get_object(), actor=request.user, recompute=data["recompute"])
        return Response(PlanSerializer(plan).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: PlanSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel the plan's jobs that have not started."""
        plan = plans.cancel(self.get_object(), actor=request.user)
        return Response(PlanSerializer(plan).data)


def _valid(serializer_class, data):
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
