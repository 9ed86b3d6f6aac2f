"""An image's template through the API: start, publish, discard, test a revision; who may."""

from accounts import access
from jobs.models import Job
from provisioning import revisions
from reservations.models import Reservation


def test_a_maintainer_runs_the_loop_through_the_api(api, sim_host, image, maya, sync_jobs):
    client = api(maya)
    started = client.post(f"/api/v1/images/{image.pk}/template/", {}, format="json")
    assert started.status_code == 202, started.json()
    template = started.json()["reservation"]
    assert template["template_of"] == image.pk and template["revision"] == revisions.production(image).pk
    sync_jobs.drain()
    assert client.get(f"/api/v1/images/{image.pk}/template/").json()["status"] == "ready"

    again = client.post(f"/api/v1/images/{image.pk}/template/", {}, format="json")
    assert again.status_code == 409 and "has a template already" in again.json()["error"]["message"]

    published = client.post(
        f"/api/v1/images/{image.pk}/template/publish/", {"production": False, "comment": "tools"}, format="json"
    )
    assert published.status_code == 202, published.json()
    sync_jobs.drain()
    assert Job.objects.get(pk=published.json()["job"]).status == "success"
    second = image.revisions.get(number=2)
    assert second.state == "testing" and Reservation.objects.get(pk=template["id"]).status == "ended"
    assert client.get(f"/api/v1/images/{image.pk}/template/").status_code == 404

    tried = client.post(f"/api/v1/image-revisions/{second.pk}/test/", {"duration": 30}, format="json")
    assert tried.status_code == 202, tried.json()
    sync_jobs.drain()
    assert Reservation.objects.select_related("vm").get(pk=tried.json()["reservation"]["id"]).vm.revision == second


def test_discard_through_the_api(api, sim_host, image, maya, sync_jobs):
    client = api(maya)
    template = client.post(f"/api/v1/images/{image.pk}/template/", {}, format="json").json()["reservation"]
    sync_jobs.drain()
    discarded = client.post(f"/api/v1/images/{image.pk}/template/discard/", format="json")
    assert discarded.status_code == 202, discarded.json()
    sync_jobs.drain()
    assert Reservation.objects.get(pk=template["id"]).status == "ended" and image.revisions.count() == 1


def test_publish_without_a_template_is_refused(api, sim_host, image, maya):
    answer = api(maya).post(f"/api/v1/images/{image.pk}/template/publish/", {}, format="json")
    assert answer.status_code == 400 and "has no template" in str(answer.json())


def test_a_student_may_not_start_or_test(api, sim_host, image, student):
    client = api(student)
    assert client.post(f"/api/v1/images/{image.pk}/template/", {}, format="json").status_code == 403
    production = revisions.production(image)
    assert client.post(f"/api/v1/image-revisions/{production.pk}/test/", {}, format="json").status_code == 403
    assert not Reservation.objects.exists()


def test_a_maintainer_of_other_groups_is_refused(api, sim_host, image, django_user_model):
    other = django_user_model.objects.create_user("sam")
    access.set_roles(other, ["image-maintainer"], actor="test")
    answer = api(other).post(f"/api/v1/images/{image.pk}/template/", {}, format="json")
    assert answer.status_code == 403  # they see the public image, but it is not theirs to change
    assert not Reservation.objects.exists()
