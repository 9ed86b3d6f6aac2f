"""Teaching an LMS course is the LMS's word for that course, from real launches: an Instructor
of one course who launches another as a Learner is that course's student."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from classes import services as classes
from lti.models import LtiCourse
from tests.lti.conftest import launch
from tests.lti_platform import LEARNER

pytestmark = pytest.mark.django_db


def test_an_instructor_elsewhere_is_a_student_of_the_course_they_learn_in(client, platform, registration):
    platform.contexts["net-202"] = {"title": "Networks 202", "roles": {"ines": [LEARNER]}}
    launch(client, platform, "ines")  # Instructor of net-101
    answer, _ = launch(client, platform, "ines", context="net-202")
    ines = User.objects.get(email="ines@uni.example")
    taught = LtiCourse.objects.get(context_id="net-101").group
    learnt = LtiCourse.objects.get(context_id="net-202").group
    assert classes.teaches(ines, taught) and not classes.teaches(ines, learnt)
    page = client.get(answer["Location"])
    assert page.status_code == 200 and b"sync-roster" not in page.content
    assert client.post(reverse("lti:sync-roster", args=[learnt.pk])).status_code == 404


def test_an_instructor_the_lms_demoted_no_longer_teaches_the_course(client, platform, registration):
    launch(client, platform, "ines")  # Instructor of net-101
    taught = LtiCourse.objects.get(context_id="net-101").group
    ines = User.objects.get(email="ines@uni.example")
    assert classes.teaches(ines, taught)
    platform.contexts["net-101"]["roles"]["ines"] = [LEARNER]
    client.logout()
    launch(client, platform, "ines")
    assert not classes.teaches(User.objects.get(pk=ines.pk), taught)
