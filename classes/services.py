"""Courses: who may see a course's page. A course is a group that is not a role group (its
members are the students, its instructors the members holding the instructor role)."""

from django.contrib.auth.models import Group

from accounts import access


def courses(user):
    """The course groups ``user`` may open: administrators and auditors every one, others their own."""
    if access.is_admin(user) or access.can(user, "see_all"):
        return Group.objects.exclude(pk__in=access.role_groups())
    return access.own_groups(user)


def teaches(user, group):
    """Whether ``user`` runs ``group``'s course: an administrator, or an instructor in it."""
    return access.is_admin(user) or access.teaching_groups(user).filter(pk=group.pk).exists()
