"""``/api/v1/verify/``: the latest cluster.verify report (staff only), a run now, releasing a
claim that nothing holds, and the repairs that run as jobs (``POST /api/v1/verify/repairs/``)."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api.permissions import IsStaffWithTokenScope, OperatorOrAuditor
from core.api.serializers import RefuseUnknownFields
from jobs import services as jobs
from provisioning import repair, verify
from provisioning.models import VerifyReport


class VerifyReportSerializer(serializers.ModelSerializer):
    class Meta:
        model = VerifyReport
        fields = ["id", "created", "job_id", "hosts_checked", "findings"]


class VerifyAcceptedSerializer(serializers.Serializer):
    job = serializers.IntegerField()


class ReleasedSerializer(serializers.Serializer):
    allocation = serializers.IntegerField()
    released = serializers.DateTimeField()


class VerifyView(APIView):
    permission_classes = [OperatorOrAuditor]

    @extend_schema(responses={200: VerifyReportSerializer})
    def get(self, request):
        """The latest report (404 before the first run)."""
        report = verify.latest()
        if report is None:
            raise Http404("no verify report yet")
        return Response(VerifyReportSerializer(report).data)

    @extend_schema(request=None, responses={202: VerifyAcceptedSerializer})
    def post(self, request):
        """Run ``cluster.verify`` now; its report appears here when the job ends."""
        job = jobs.submit("cluster.verify", {}, actor=request.user, source=f"api:{request.user.get_username()}")
        return Response({"job": job.pk}, status=status.HTTP_202_ACCEPTED)


class ReleaseClaimView(APIView):
    permission_classes = [OperatorOrAuditor]

    @extend_schema(request=None, responses={200: ReleasedSerializer})
    def post(self, request, pk):
        """Release an orphan claim (409 when something holds it or it is released already)."""
        try:
            allocation = verify.release_orphan_claim(pk, "released through the API after verify", actor=request.user)
        except verify.Allocation.DoesNotExist:
            raise Http404(f"no claim {pk}") from None
        return Response({"allocation": allocation.pk, "released": allocation.released})


class RepairSerializer(RefuseUnknownFields, serializers.Serializer):
    action = serializers.ChoiceField(choices=repair.ACTIONS)
    host = serializers.CharField(max_length=100, required=False, help_text="adopt, destroy: the host's name.")
    key = serializers.CharField(max_length=200, required=False, help_text="adopt, destroy: the VM's name there.")
    owner = serializers.CharField(max_length=150, required=False, help_text="adopt: a user name (default: you).")
    force = serializers.BooleanField(default=False, help_text="destroy: also a name that is not vclmgr's.")
    vm = serializers.IntegerField(min_value=1, required=False, help_text="drift, absent: the VM's id.")


class RepairView(APIView):
    permission_classes = [IsStaffWithTokenScope]  # repairs destroy and adopt VMs: administrators only

    @extend_schema(request=RepairSerializer, responses={202: VerifyAcceptedSerializer})
    def post(self, request):
        """Submit one repair of a finding as a job (``repair.<action>``; it checks the host again)."""
        serializer = RepairSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        try:
            job = repair.submit(
                data.pop("action"), data, actor=request.user, source=f"api:{request.user.get_username()}"
            )
        except DjangoValidationError as exc:
            raise serializers.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            ) from None
        return Response({"job": job.pk}, status=status.HTTP_202_ACCEPTED)
