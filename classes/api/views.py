"""Classes REST API. Thin: reads through ``services.visible_classes``, writes through the services.

Members of a course read its classes (administrators and auditors every course's); its
instructors (and administrators) create, change and delete them. A course or class not yours
is a 404 (never a 403 that would confirm it exists); one you may read but not change is a 403.
A class's ``budget/`` is every student's hours for its instructors, a student's own for them;
``grants/`` gives a student extra hours (instructors only).
"""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from accounts.api.permissions import IsAuthenticatedWithTokenScope
from classes import budget as budgets
from classes import services
from classes.api.serializers import ClassSerializer, GrantSerializer, StandingSerializer
from classes.models import Class
from environments import services as environment_services
from inventory.api.serializers import as_drf
from provisioning import services as vms
from reservations.api.serializers import ApprovalRequestSerializer
from reservations.models import ApprovalRequest


class ClassViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Classes with a term: weekly sessions of an image for a course, seats built before each."""

    serializer_class = ClassSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    write_scope = "reserve"
    filterset_fields = ["course", "image"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Class.objects.none()
        return services.visible_classes(self.request.user).prefetch_related("sessions", "exceptions").order_by("pk")

    def _managed(self):
        klass = self.get_object()
        if not services.managed_classes(self.request.user).filter(pk=klass.pk).exists():
            raise PermissionDenied("only the course's instructors may change its classes")
        return klass

    def _values(self, serializer):
        values = serializer.service_values(serializer.validated_data)
        if "image_id" in values:
            image = vms.visible_images(self.request.user).filter(pk=values.pop("image_id")).first()
            if image is None:
                raise as_drf(ValidationError({"image": ["no such image, or you may not use it"]}))
            values["image"] = image
        if "environment_id" in values:
            template_id = values.pop("environment_id")
            template = None
            if template_id is not None:
                template = environment_services.visible_templates(self.request.user).filter(pk=template_id).first()
                if template is None:
                    raise as_drf(ValidationError({"environment": ["no such environment, or you may not use it"]}))
            values["environment"] = template
        return values

    @extend_schema(responses={201: ClassSerializer, 202: ApprovalRequestSerializer})
    def create(self, request, *args, **kwargs):
        """Make a class (201); one that requires approval, or of an image that does, waits for an
        approver instead (202 with the approval request: nothing is claimed until approved)."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        self.perform_create(serializer)
        if isinstance(serializer.instance, ApprovalRequest):
            body = ApprovalRequestSerializer(serializer.instance, context=self.get_serializer_context()).data
            return Response(body, status=status.HTTP_202_ACCEPTED)
        return Response(serializer.data, status=status.HTTP_201_CREATED)

    def perform_create(self, serializer):
        values = self._values(serializer)
        course = get_object_or_404(services.courses(self.request.user), pk=values.pop("course_id"))
        if not services.teaches(self.request.user, course):
            raise PermissionDenied("only the course's instructors may make its classes")
        try:
            serializer.instance = services.create_class(
                actor=self.request.user, by=self.request.user, course=course, **values
            )
        except ValidationError as exc:
            raise as_drf(exc) from None

    def perform_update(self, serializer):
        klass = self._managed()
        values = self._values(serializer)
        if "course_id" in values and values.pop("course_id") != klass.course_id:
            raise as_drf(ValidationError({"course": ["a class stays in its course"]}))
        try:
            serializer.instance = services.change_class(klass, actor=self.request.user, by=self.request.user, **values)
        except ValidationError as exc:
            raise as_drf(exc) from None

    def perform_destroy(self, instance):
        services.delete_class(self._managed(), actor=self.request.user)

    @extend_schema(request=None, responses={200: StandingSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def budget(self, request, pk=None):
        """The hours budget: every student's for the course's instructors, your own for a student
        (an empty list for anyone else)."""
        klass = self.get_object()
        if services.teaches(request.user, klass.course):
            users = list(budgets.students(klass))
        else:
            users = [request.user] if budgets.studied(request.user).filter(pk=klass.pk).exists() else []
        rows = [StandingSerializer.of(u, s) for u, s in zip(users, budgets.roster(klass, users), strict=True)]
        return Response(StandingSerializer(rows, many=True).data)

    @extend_schema(request=GrantSerializer, responses={201: GrantSerializer})
    @action(detail=True, methods=["post"], pagination_class=None, filter_backends=[])
    def grants(self, request, pk=None):
        """Give a student extra hours of the class's budget (the course's instructors)."""
        klass = self._managed()
        body = GrantSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        student = get_user_model().objects.filter(username=data["student"]).first()
        try:
            grant = budgets.grant_hours(
                klass, student, data["hours"], data["reason"], actor=request.user, by=request.user
            )
        except ValidationError as exc:
            raise as_drf(exc) from None
        answer = {**data, "id": grant.pk, "at": grant.at, "granted_by": request.user.get_username()}
        return Response(GrantSerializer(answer).data, status=status.HTTP_201_CREATED)
