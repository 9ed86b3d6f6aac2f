"""``/api/v1/verify/``: the latest cluster.verify report (staff only), a run now, and the one
repair it offers: releasing a claim that nothing holds."""

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from provisioning.jobs import services as jobs
from provisioning.vms import verify
from provisioning.vms.models import VerifyReport
from vclmgr.api.permissions import IsStaffWithTokenScope


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
    permission_classes = [IsStaffWithTokenScope]

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
    permission_classes = [IsStaffWithTokenScope]

    @extend_schema(request=None, responses={200: ReleasedSerializer})
    def post(self, request, pk):
        """Release an orphan claim (409 when something holds it or it is released already)."""
        try:
            allocation = verify.release_orphan_claim(pk, "released through the API after verify", actor=request.user)
        except verify.Allocation.DoesNotExist:
            raise Http404(f"no claim {pk}") from None
        return Response({"allocation": allocation.pk, "released": allocation.released})
