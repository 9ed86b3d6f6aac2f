"""A course's page: where an LMS launch lands and where its members find their class."""

from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from classes import services
from core.hooks import Hook

# Cards of the layers above on the course page (lti: the LMS roster sync), filled in their
# ready(): ``(request, group) -> context`` with the card's ``template``, or None (no card).
COURSE_CARDS: Hook[Callable] = Hook("classes.views.COURSE_CARDS")


@login_required
def course(request, group_id):
    group = get_object_or_404(services.courses(request.user), pk=group_id)  # not yours: 404
    members = group.user_set.order_by("username") if services.teaches(request.user, group) else None
    cards = [card for card in (make(request, group) for make in COURSE_CARDS) if card]
    return render(request, "classes/course.html", {"course": group, "members": members, "cards": cards})
