"""Reservations REST API. Thin: reads through ``services.visible``, writes through the services.

Users see and act on their own reservations (another user's id is a 404, never a 403 that
would confirm it exists); staff see all. Endpoints that start work answer ``202`` with the
job and its URL; the connection password goes to the reservation's own user only.
"""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import access
from accounts.api.permissions import AuditorOrAdmin, IsAuthenticatedWithTokenScope
from inventory.api.serializers import as_drf
from reservations import approvals, services
from reservations.api.serializers import (
    ApprovalRequestSerializer,
    BlockAllocationSerializer,
    DecisionSerializer,
    ExtendSerializer,
    FitCheckSerializer,
    FitSerializer,
    ReservationAcceptedSerializer,
    ReservationCreateSerializer,
    ReservationSerializer,
    ShowbackQuerySerializer,
    ShowbackReportSerializer,
    UsageQuerySerializer,
    UsageReportSerializer,
    job_url,
)
from reservations.models import ApprovalRequest, BlockAllocation, Reservation

CONFLICT = OpenApiResponse(description="Conflict with the current state")


def _accepted(reservation, job, request, created=True):
    body = {
        "reservation": ReservationSerializer(reservation, context={"request": request}).data,
        "job": job.pk if job else None,
        "job_url": job_url(job, request),
    }
    headers = {"Location": body["job_url"]} if job else {}
    code = status.HTTP_202_ACCEPTED if job else (status.HTTP_201_CREATED if created else status.HTTP_200_OK)
    return Response(body, status=code, headers=headers)


class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Reservations: create, list your own (staff: all), extend, end, cancel."""

    serializer_class = ReservationSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    write_scope = "reserve"
    filterset_fields = ["status", "image", "block"]
    ordering_fields = ["start", "end", "created", "status"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Reservation.objects.none()
        return (
            services.visible(self.request.user)
            .select_related("user", "image", "vm")
            .prefetch_related("history")
            .order_by("-start", "-id")
        )

    @extend_schema(
        request=ReservationCreateSerializer,
        responses={201: ReservationAcceptedSerializer, 202: ReservationAcceptedSerializer},
    )
    def create(self, request):
        """Reserve an image now or later. 202 with the VM job when building starts now; 201 otherwise.
        An image that requires approval (or an environment with a machine of one): 202 with
        ``approval``, the request waiting for an approver (no reservation yet, nothing claimed)."""
        body = ReservationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        existing = (
            data["request_key"]
            and Reservation.objects.filter(user=request.user, request_key=data["request_key"]).exists()
        )
        environment = data.pop("environment", None)
        try:
            if environment is not None:
                for name in ("gpus", "gpu_model"):
                    data.pop(name)
                template = services.visible_environment(request.user, environment)
                data.pop("image")
                reservation = services.ask_environment(request.user, template, actor=request.user, **data)
            else:
                reservation = services.ask_reservation(request.user, data.pop("image"), actor=request.user, **data)
        except ValidationError as exc:
            raise as_drf(exc) from None
        if isinstance(reservation, ApprovalRequest):  # nothing made yet: it waits for an approver
            body = {"reservation": None, "job": None, "job_url": None}
            body["approval"] = ApprovalRequestSerializer(reservation, context={"request": request}).data
            return Response(body, status=status.HTTP_202_ACCEPTED)
        job = services.build_job(reservation) if not existing else None
        return _accepted(reservation, job, request, created=not existing)

    @extend_schema(request=ExtendSerializer, responses={200: ReservationSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        """Move the end later; refused (400, with the reason) when the host has no room then."""
        reservation = self.get_object()
        body = ExtendSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            reservation = services.extend(reservation, body.validated_data["end"], actor=request.user)
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response(ReservationSerializer(reservation, context={"request": request}).data)

    @extend_schema(request=None, responses={202: ReservationAcceptedSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def end(self, request, pk=None):
        """End now: the VM is torn down (or reverted) by a job (202 with it)."""
        reservation = self.get_object()
        job = services.end(reservation, "ended through the API", actor=request.user)
        reservation.refresh_from_db()
        return _accepted(reservation, job, request, created=False)

    @extend_schema(request=None, responses={200: ReservationSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a reservation that has not started building; its capacity is given back."""
        reservation = self.get_object()
        reservation = services.cancel(reservation, "canceled through the API", actor=request.user)
        return Response(ReservationSerializer(reservation, context={"request": request}).data)

    def _whole(self, request, verb, reason):
        # Only its owner and administrators: anyone else, even one who may read it, gets a 404.
        reservation = get_object_or_404(services.operable(request.user), pk=self.get_object().pk)
        job = verb(reservation, reason, actor=request.user)
        reservation.refresh_from_db()
        return _accepted(reservation, job, request, created=False)

    @extend_schema(request=None, responses={202: ReservationAcceptedSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def suspend(self, request, pk=None):
        """An environment's head: suspend every machine, as one (202 with the job). Its claims
        stay whole until its end. A machine alone, or an environment not ready: 409."""
        return self._whole(request, services.suspend, "suspended through the API")

    @extend_schema(request=None, responses={202: ReservationAcceptedSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """An environment's head: resume every machine, as one (202 with the job)."""
        return self._whole(request, services.resume, "resumed through the API")

    @extend_schema(request=None, responses={202: ReservationAcceptedSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def revert(self, request, pk=None):
        """An environment's head: every machine back to its clean snapshot and started again, as
        one (202 with the job); 409 when a machine's image keeps no snapshot."""
        return self._whole(request, services.revert, "reverted through the API")


class ApprovalRequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Requests waiting for approval. Approvers (and administrators) list the pending ones they
    may decide (``?mine=1``: their own requests); anyone else lists their own. Approve or deny
    with a reason; a requester never decides their own (but may withdraw it), a non-approver
    gets 403."""

    serializer_class = ApprovalRequestSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    write_scope = "reserve"
    filterset_fields = ["status", "kind", "image"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApprovalRequest.objects.none()
        user = self.request.user
        if self.action == "list":
            deciding = access.is_admin(user) or access.can(user, "approve")
            found = services.decidable(user) if deciding and self.request.query_params.get("mine") != "1" else None
            if found is None:
                found = ApprovalRequest.objects.filter(requester=user)
        else:
            found = approvals.visible(user)
        return found.select_related("requester", "image", "decided_by").order_by("expires_at", "pk")

    def _decide(self, verb):
        if not (access.is_admin(self.request.user) or access.can(self.request.user, "approve")):
            raise PermissionDenied("only approvers and administrators decide requests")
        approval = self.get_object()
        body = DecisionSerializer(data=self.request.data)
        body.is_valid(raise_exception=True)
        try:
            approval = verb(approval, actor=self.request.user, reason=body.validated_data["reason"])
        except DjangoPermissionDenied as exc:
            raise PermissionDenied(str(exc)) from None
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response(ApprovalRequestSerializer(approval, context={"request": self.request}).data)

    @extend_schema(request=DecisionSerializer, responses={200: ApprovalRequestSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve: the reservation or class is made now (``status`` approved, ``made_id``), or
        ``failed`` with why when it no longer fits. The requester is told either way."""
        return self._decide(services.approve)

    @extend_schema(request=DecisionSerializer, responses={200: ApprovalRequestSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def deny(self, request, pk=None):
        """Deny, with a reason (required); the requester is told it. Nothing was held."""
        return self._decide(services.deny)

    @extend_schema(request=None, responses={200: ApprovalRequestSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        """The requester takes back a request still waiting (anyone else: 403)."""
        try:
            approval = services.withdraw(self.get_object(), actor=request.user)
        except DjangoPermissionDenied as exc:
            raise PermissionDenied(str(exc)) from None
        return Response(ApprovalRequestSerializer(approval, context={"request": request}).data)


class FitCheckView(APIView):
    """Would a reservation fit? If not: why, and the earliest start that would. Writes nothing."""

    permission_classes = [IsAuthenticatedWithTokenScope]
    write_scope = "reserve"

    @extend_schema(request=FitCheckSerializer, responses={200: FitSerializer})
    def post(self, request):
        body = FitCheckSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        image = data["image"]
        from django.utils import timezone

        start = data["start"] or timezone.now()
        end = data["end"] or start + data["duration"]
        errors = services.validate(request.user, image, start, end)
        if errors:
            raise as_drf(ValidationError(errors))
        return Response(services.check_fit(image, start, end, data["gpus"], data["gpu_model"]).as_dict())


class BlockAllocationViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Class blocks: N seats of an image for a group, weekly. Managers create; members take seats."""

    serializer_class = BlockAllocationSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    write_scope = "reserve"
    filterset_fields = ["group", "image", "canceled"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return BlockAllocation.objects.none()
        blocks = BlockAllocation.objects.select_related("group", "image").order_by("-start", "-id")
        user = self.request.user
        if services.may_manage_blocks(user):
            return blocks
        return blocks.filter(Q(group__in=user.groups.all()))

    def perform_create(self, serializer):
        if not services.may_manage_blocks(self.request.user):
            raise PermissionDenied("only staff and instructors may create block allocations")
        data = dict(serializer.validated_data)
        try:
            serializer.instance = services.create_block(actor=self.request.user, created_by=self.request.user, **data)
        except ValidationError as exc:
            raise as_drf(exc) from None

    @extend_schema(request=None, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"], url_path="take-seat")
    def take_seat(self, request, pk=None):
        """Take one of the block's free seats (members of its group)."""
        block = self.get_object()
        try:
            seat = services.take_seat(request.user, block, actor=request.user)
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response(ReservationSerializer(seat, context={"request": request}).data)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel the block: every seat still active is ended or canceled."""
        if not services.may_manage_blocks(request.user):
            raise PermissionDenied("only staff and instructors may cancel block allocations")
        # Another instructor's block is not found, as on the page (members can see it, not cancel it).
        block = get_object_or_404(services.managed_blocks(request.user), pk=self.get_object().pk)
        services.cancel_block(block, "canceled through the API", actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

        services.cancel_block(block, "canceled through the API", actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UsageView(APIView):
    """Staff: the usage report (hours per image, group and day, peak concurrency, refusals by
    reason, mean time to ready) for UTC days ``from``..``to``; past days come pre-aggregated."""

    permission_classes = [AuditorOrAdmin]

    def _report(self, request):
        from reservations import usage

        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in query.validated_data.items() if v}
        try:
            first, last, image, group = usage.filters(params)
        except ValueError as exc:
            raise as_drf(ValidationError({"from": [str(exc)]})) from None
        return usage.report(first, last, image=image, group=group)

    @extend_schema(parameters=[UsageQuerySerializer], responses={200: UsageReportSerializer})
    def get(self, request):
        return Response(self._report(request))


class UsageCSVView(UsageView):
    """The same report as CSV (outside the JSON schema)."""

    @extend_schema(exclude=True)
    def get(self, request):
        from django.http import HttpResponse

        from reservations import usage

        data = self._report(request)
        response = HttpResponse(usage.csv_text(data), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="usage-{data["from"]}-{data["to"]}.csv"'
        return response


class ShowbackView(APIView):
    """Usage of every kind (reservations, class seats, batch runs, ad-hoc VMs) grouped ``by``
    user, class, group or image: hours, vCPU-hours, GiB-hours, GPU-hours, uses and (with
    ``USAGE_PRICES``) cost. What the caller may see only: administrators and auditors
    everything, instructors their classes' seats per student and their own, others their own."""

    permission_classes = [IsAuthenticatedWithTokenScope]

    def _report(self, request):
        from reservations import showback

        query = ShowbackQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in query.validated_data.items() if v}
        try:
            first, last, by, filters = showback.filters_of(params)
        except ValueError as exc:
            raise as_drf(ValidationError({"from": [str(exc)]})) from None
        return showback.report(first, last, by=by, scope=showback.visible_usage(request.user), filters=filters)

    @extend_schema(parameters=[ShowbackQuerySerializer], responses={200: ShowbackReportSerializer})
    def get(self, request):
        return Response(self._report(request))


class ShowbackCSVView(ShowbackView):
    """The same report as CSV (outside the JSON schema)."""

    @extend_schema(exclude=True)
    def get(self, request):
        from django.http import HttpResponse

        from reservations import showback

        data = self._report(request)
        response = HttpResponse(showback.csv_text(data), content_type="text/csv")
        name = f"usage-by-{data['by']}-{data['from']}-{data['to']}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
