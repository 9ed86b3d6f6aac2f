"""The image page's template card: its maintainers start, publish, discard and test from it;
students see no card and may not post to it."""

from reservations import services
from reservations.models import Reservation


def page(client, image):
    response = client.get(f"/vms/images/{image.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_maintainer_runs_the_loop_from_the_image_page(client, sim_host, image, maya, sync_jobs):
    client.force_login(maya)
    html = page(client, image)
    assert 'id="template"' in html and 'id="template-start"' in html

    assert client.post(f"/reservations/images/{image.pk}/template/").status_code == 302
    sync_jobs.drain()
    html = page(client, image)
    template = services.open_template(image)
    assert f"reservation {template.pk}" in html and "Publish (testing)" in html and "Publish (production)" in html
    assert 'id="template-start"' not in html

    response = client.post(f"/reservations/images/{image.pk}/template/publish/", {"production": "0", "comment": "x"})
    assert response.status_code == 302
    sync_jobs.drain()
    html = page(client, image)
    second = image.revisions.get(number=2)
    assert second.state == "testing" and 'id="template-made"' in html and "data-job-progress" in html
    assert "Test this revision" in html and 'id="template-start"' in html  # the template ended
    assert "<script>" not in html  # the progress is the static script's (CSP)

    tried = client.post(f"/reservations/revisions/{second.pk}/test/")
    reservation = Reservation.objects.get(revision=second, template_of=None)
    assert tried.status_code == 302 and tried["Location"] == f"/reservations/{reservation.pk}/"
    assert "Built from revision 2 of debian-12 (testing)" in client.get(tried["Location"]).content.decode()


def test_the_templates_reservation_page_points_to_the_image_page(client, sim_host, image, maya, sync_jobs):
    client.force_login(maya)
    client.post(f"/reservations/images/{image.pk}/template/")
    html = client.get(f"/reservations/{services.open_template(image).pk}/").content.decode()
    assert 'id="template-note"' in html and f'href="/vms/images/{image.pk}/#template"' in html


def test_discard_from_the_image_page(client, sim_host, image, maya, sync_jobs):
    client.force_login(maya)
    client.post(f"/reservations/images/{image.pk}/template/")
    sync_jobs.drain()
    client.post(f"/reservations/images/{image.pk}/template/discard/")
    sync_jobs.drain()
    assert services.open_template(image) is None and image.revisions.count() == 1


def test_a_second_start_is_refused_in_words(client, sim_host, image, maya, sync_jobs):
    client.force_login(maya)
    client.post(f"/reservations/images/{image.pk}/template/")
    response = client.post(f"/reservations/images/{image.pk}/template/", follow=True)
    assert "has a template already" in response.content.decode()
    assert Reservation.objects.count() == 1


def test_students_see_no_card_and_may_not_start_one(client, sim_host, image, student):
    client.force_login(student)
    assert 'id="template"' not in page(client, image)
    response = client.post(f"/reservations/images/{image.pk}/template/", follow=True)
    assert "only an image maintainer" in response.content.decode()
    assert not Reservation.objects.exists()
