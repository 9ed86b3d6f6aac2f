from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import access, preferences, tokens
from accounts.api.permissions import IsStaffWithTokenScope
from accounts.api.serializers import (
    ApiTokenSerializer,
    MeSerializer,
    NewApiTokenSerializer,
    UserRolesSerializer,
    UserSerializer,
)
from accounts.models import ApiToken


class MeView(APIView):
    """You: GET your account; PATCH your own time zone (a token needs the scope ``reserve``)."""

    write_scope = "reserve"

    @extend_schema(responses=UserSerializer)
    def get(self, request):
        return Response(UserSerializer(request.user).data)

    @extend_schema(request=MeSerializer, responses=UserSerializer)
    def patch(self, request):
        body = MeSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        if "time_zone" in body.validated_data:
            try:
                preferences.set_time_zone(request.user, body.validated_data["time_zone"], actor=request.user)
            except DjangoValidationError as exc:
                raise ValidationError(exc.message_dict) from None
        return Response(UserSerializer(request.user).data)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own API tokens. The token itself is returned once, by create."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()
    ordering_fields = ["created", "name"]

    def get_queryset(self):
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(request=ApiTokenSerializer, responses={201: NewApiTokenSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        row, clear = tokens.issue(request.user, **serializer.validated_data)
        data = NewApiTokenSerializer(row).data
        data["token"] = clear
        return Response(data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        tokens.revoke(self.request.user, instance.pk)


class UserRolesView(APIView):
    """A user's roles (administrators): GET them, PUT the whole list (admin, operator, auditor,
    instructor, image-maintainer, approver). Their tokens follow at their next request."""

    permission_classes = [IsStaffWithTokenScope]

    @extend_schema(responses=UserRolesSerializer)
    def get(self, request, pk):
        user = get_object_or_404(get_user_model(), pk=min(pk, 2**63 - 1))
        return Response({"roles": access.roles(user)})

    @extend_schema(request=UserRolesSerializer, responses=UserRolesSerializer)
    def put(self, request, pk):
        user = get_object_or_404(get_user_model(), pk=min(pk, 2**63 - 1))
        body = UserRolesSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            roles = access.set_roles(user, body.validated_data["roles"], actor=request.user)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        return Response({"roles": roles})
