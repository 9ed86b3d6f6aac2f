"""LTI API (administrators): the platforms vclmgr trusts, and the tool's keys."""

from drf_spectacular.utils import extend_schema
from lti_tool.models import LtiRegistration
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api.permissions import IsStaffWithTokenScope
from lti import services
from lti.api.serializers import KeySerializer, PlatformSerializer, RotatedSerializer, RotateSerializer


class PlatformViewSet(viewsets.ModelViewSet):
    """LMS platforms (LTI 1.3 registrations): issuer, client id, deployment ids and the
    platform's key set, auth login and token URLs."""

    serializer_class = PlatformSerializer
    permission_classes = [IsStaffWithTokenScope]
    queryset = LtiRegistration.objects.order_by("name", "pk")
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def perform_destroy(self, instance):
        services.remove_platform(instance, actor=self.request.user)


class KeyListView(APIView):
    """The tool's signing keys (public facts only; the JWKS itself is /lti/jwks/)."""

    permission_classes = [IsStaffWithTokenScope]

    @extend_schema(responses=KeySerializer(many=True))
    def get(self, request):
        return Response(KeySerializer(services.key_rows(), many=True).data)


class KeyRotateView(APIView):
    """Make a new signing key; retire active keys older than ``retire_after_days``."""

    permission_classes = [IsStaffWithTokenScope]

    @extend_schema(request=RotateSerializer, responses=RotatedSerializer)
    def post(self, request):
        body = RotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        kid, retired = services.rotate_keys(actor=request.user, **body.validated_data)
        return Response({"kid": kid, "retired": retired})
