"""A course's page: where an LMS launch lands and where its members find their class."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from classes import services


@login_required
def course(request, group_id):
    group = get_object_or_404(services.courses(request.user), pk=group_id)  # not yours: 404
    members = group.user_set.order_by("username") if services.teaches(request.user, group) else None
    return render(request, "classes/course.html", {"course": group, "members": members})
