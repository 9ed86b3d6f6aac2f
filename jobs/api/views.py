"""REST API of jobs (``/api/v1/jobs/``), the queue (``/api/v1/queue/``) and opcodes.

Users see and act on their own jobs; staff on all. Every endpoint that starts work answers
``202 Accepted`` with the job and its URL in ``Location``.
"""

from django.db.models import Prefetch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import access
from accounts.api.permissions import role_required
from jobs import registry, services
from jobs.api.filters import JobFilterSet
from jobs.api.serializers import (
    JobActionSerializer,
    JobBatchSerializer,
    JobLogSerializer,
    JobSerializer,
    JobSubmitSerializer,
    OpcodeSerializer,
    QueueSerializer,
)
from jobs.models import Job

MAX_LOG = 1000


def _depend_ids(depends):
    for item in depends:
        target = item[0] if isinstance(item, list) and item else item
        if isinstance(target, int) and not isinstance(target, bool) and 0 < target <= services.MAX_ID:
            yield target


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs: list (filters, search, ordering), detail, submit, cancel, retry, log."""

    serializer_class = JobSerializer
    filterset_class = JobFilterSet
    search_fields = ["opcode", "waiting_for", "error_message"]
    ordering_fields = ["id", "received", "started", "ended", "priority", "status"]
    ordering = ["-id"]
    queryset = Job.objects.none()

    def get_queryset(self):
        queryset = (
            services.visible_to(self.request.user)
            .select_related("submitter")
            .prefetch_related("dependencies", Prefetch("children", queryset=Job.objects.only("id", "parent_id")))
        )
        if self.action == "list" and "archived" not in self.request.query_params:
            queryset = queryset.filter(archived=False)
        return queryset

    def _accepted(self, jobs):
        rows = {job.pk: job for job in self.get_queryset().filter(pk__in=[j.pk for j in jobs])}
        data = [JobSerializer(rows[job.pk], context=self.get_serializer_context()).data for job in jobs]
        return data

    def _accepted_one(self, job):
        """202 Accepted with the job, and its URL in Location."""
        data = self._accepted([job])[0]
        return Response(data, status=status.HTTP_202_ACCEPTED, headers={"Location": data["url"]})

    def _reason(self, request):
        serializer = JobActionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data["reason"]

    def _check_submit(self, user, spec):
        if not registry.may_submit(user, spec["opcode"]):
            raise PermissionDenied(f"your role may not submit {spec['opcode']} jobs")
        if not access.token_permits(self.request, registry.get(spec["opcode"]).scope, f"job {spec['opcode']}"):
            raise PermissionDenied(f"this token does not carry the scope {spec['opcode']} jobs need")
        if spec.get("priority", 0) > 0 and not access.can(user, "operate"):
            raise ValidationError({"priority": ["only operators may raise the priority above 0"]})
        ids = set(_depend_ids(spec.get("depends", [])))
        visible = set(services.visible_to(user).filter(pk__in=ids).values_list("pk", flat=True))
        hidden = sorted(ids - visible)
        if hidden:
            raise ValidationError({"depends": [f"job {hidden[0]} does not exist"]})

    @extend_schema(request=JobSubmitSerializer, responses={202: JobSerializer})
    def create(self, request):
        """Submit a job. 202 with the job; ``Location`` is its URL."""
        serializer = JobSubmitSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        spec = serializer.validated_data
        self._check_submit(request.user, spec)
        job = services.submit(
            spec["opcode"],
            spec["params"],
            actor=request.user,
            reason=spec.get("reason"),
            source=f"api:{request.user.get_username()}",
            priority=spec["priority"],
            depends=spec["depends"],
            capped=True,
        )
        return self._accepted_one(job)

    @extend_schema(request=JobBatchSerializer, responses={202: JobSerializer(many=True)})
    @action(detail=False, methods=["post"])
    def batch(self, request):
        """Submit several jobs at once, all or none; later ones may depend on earlier ones by "@name"."""
        serializer = JobBatchSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        specs = [dict(spec) for spec in serializer.validated_data["jobs"]]
        for spec in specs:
            self._check_submit(request.user, spec)
        jobs = services.submit_batch(
            specs, actor=request.user, source=f"api:{request.user.get_username()}", capped=True
        )
        return Response(self._accepted(jobs), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=JobActionSerializer, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: queued and waiting jobs end at once, running ones after their current step."""
        job, reason = self.get_object(), self._reason(request)
        job = services.cancel(job, actor=request.user, reason=reason)
        return self._accepted_one(job)

    @extend_schema(request=JobActionSerializer, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """Submit a failed or canceled job again as a new job (``retry_of`` links them)."""
        job, reason = self.get_object(), self._reason(request)
        if not registry.may_submit(request.user, job.opcode):
            raise PermissionDenied(f"only staff may submit {job.opcode} jobs")
        new = services.retry(job, actor=request.user, reason=reason, capped=True)
        return self._accepted_one(new)

    @extend_schema(
        parameters=[
            OpenApiParameter("after", OpenApiTypes.INT, description="Only entries after this log id."),
            OpenApiParameter("limit", OpenApiTypes.INT, description=f"At most this many (≤ {MAX_LOG})."),
        ],
        responses=JobLogSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def log(self, request, pk=None):
        """The job's log, oldest first; poll with ``after`` = the last id you have."""
        job = self.get_object()
        after = _int_param(request, "after", 0, 0, 2**62)
        limit = _int_param(request, "limit", MAX_LOG, 1, MAX_LOG)
        entries = services.log_visible_to(request.user, job).filter(id__gt=after).order_by("id")[:limit]
        return Response(JobLogSerializer(entries, many=True).data)


def _int_param(request, name, default, low, high):
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: ["must be a whole number"]}) from None
    if not low <= value <= high:
        raise ValidationError({name: [f"must be between {low} and {high}"]})
    return value


class QueueView(APIView):
    """The job queue: its tunables (limit of running jobs, lease, attempts) and what it holds."""

    permission_classes = [role_required(read=None, write="operate", scope="operate")]

    @extend_schema(responses=QueueSerializer)
    def get(self, request):
        return Response(QueueSerializer(services.queue_state(viewer=request.user)).data)

    @extend_schema(request=QueueSerializer, responses=QueueSerializer)
    def put(self, request):
        """Change the tunables (staff); they take effect at the next dispatch, no restart."""
        serializer = QueueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        row = services.set_queue_settings(
            actor=request.user,
            limit=data.get("limit"),
            lease_seconds=data.get("lease_seconds"),
            max_attempts=data.get("max_attempts"),
            reason=data.get("reason", ""),
        )
        return Response(QueueSerializer(services.queue_state(row)).data)

    @extend_schema(request=QueueSerializer, responses=QueueSerializer)
    def patch(self, request):
        return self.put(request)


class OpcodeListView(APIView):
    """The registered opcodes, their parameters, and whether only staff may submit them."""

    @extend_schema(responses=OpcodeSerializer(many=True))
    def get(self, request):
        return Response(OpcodeSerializer(registry.all_opcodes(), many=True).data)
