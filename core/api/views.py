from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from core import events, topics
from core.api.serializers import EventSerializer


class EventListView(APIView):
    """Events after an id, for clients that poll instead of holding a websocket."""

    @extend_schema(
        parameters=[
            OpenApiParameter("topic", OpenApiTypes.STR, many=True, required=True),
            OpenApiParameter("since", OpenApiTypes.INT, required=False),
        ],
        responses=EventSerializer(many=True),
    )
    def get(self, request):
        wanted = request.query_params.getlist("topic")
        if not wanted:
            raise ValidationError({"topic": ["give at least one topic"]})
        denied = [t for t in wanted if not topics.may_subscribe(request.user, t)]
        if denied:
            raise PermissionDenied(f"not allowed to read topic {denied[0]}")
        try:
            since = int(request.query_params.get("since", 0))
        except ValueError:
            raise ValidationError({"since": ["must be an integer"]}) from None
        if since < 0 or since > 2**62:
            raise ValidationError({"since": ["out of range"]})
        return Response(EventSerializer(events.since(wanted, since, limit=500), many=True).data)
