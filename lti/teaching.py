"""Who teaches an LMS course: the LMS says, per course (``accounts.access.COURSE_TEACHERS``).

A launch's roles are recorded per context by django-lti (``sync_data_from_launch`` keeps an
``LtiMembership`` of the launch's ``LtiUser`` in its ``LtiContext``, ``is_instructor`` from
the Instructor context role); ``LtiCourse`` names the context (its registration's deployment,
its id on the platform) and the group. So an Instructor of one LMS course teaches that one, and
is a student of another they are a Learner in, although their account holds the site-wide
instructor role (which lets them use a local course's instructor pages).
"""

from django.db.models import Q
from lti_tool.models import LtiMembership

from lti.models import LtiCourse


def course_teachers(group_ids):
    """``{group id: ids of the accounts the LMS made an Instructor of it}`` of the LMS courses
    among ``group_ids`` (others are left out: not an LMS course)."""
    courses = LtiCourse.objects.filter(group_id__in=list(group_ids))
    courses = list(courses.values_list("group_id", "registration_id", "context_id"))
    found = {group: set() for group, _, _ in courses}
    if not courses:
        return found
    which = Q(pk__in=())
    for _, registration, context in courses:
        which |= Q(context__deployment__registration_id=registration, context__id_on_platform=context)
    rows = (
        LtiMembership.objects.filter(which, is_instructor=True, is_active=True, user__auth_user__isnull=False)
        .values_list("context__deployment__registration_id", "context__id_on_platform", "user__auth_user_id")
        .order_by()
    )
    group_of = {(registration, context): group for group, registration, context in courses}
    for registration, context, user in rows:
        found[group_of[(registration, context)]].add(user)
    return found
