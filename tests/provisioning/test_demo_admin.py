import io

from provisioning import demo
from provisioning.models import Image


def test_the_demo_step_is_idempotent(db):
    out = io.StringIO()
    demo.images(out)
    demo.images(out)
    assert Image.objects.count() == len(demo.IMAGES)
    assert all(image.variants.filter(hypervisor_type="sim").exists() for image in Image.objects.all())
    assert "3 demo images" in out.getvalue() and "3 already there" in out.getvalue()


def test_admin_pages_answer(client, admin_user, image, sim_host, alice, sync_jobs):
    from provisioning import services

    services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    client.force_login(admin_user)
    for url in (
        "/admin/vms/image/",
        f"/admin/vms/image/{image.pk}/change/",
        "/admin/vms/vm/",
        "/admin/vms/hostimage/",
        "/admin/vms/image/add/",
    ):
        assert client.get(url).status_code == 200, url
