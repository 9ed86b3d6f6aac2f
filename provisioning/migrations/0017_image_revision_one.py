from django.db import migrations, models

COMMENT = "the image as it was before revisions"


def first_revisions(apps, schema_editor):
    """Every image becomes revision 1, in production, holding all its variants; its VMs were
    built from it. Nothing is copied or dropped: the rows are only pointed at the revision."""
    Image = apps.get_model("vms", "Image")
    ImageRevision = apps.get_model("vms", "ImageRevision")
    ImageVariant = apps.get_model("vms", "ImageVariant")
    VM = apps.get_model("vms", "VM")
    for image in Image.objects.filter(revisions__isnull=True).order_by("pk").iterator():
        revision = ImageRevision.objects.create(
            image=image, number=1, state="production", created=image.created, comment=COMMENT
        )
        ImageVariant.objects.filter(image=image, revision__isnull=True).update(revision=revision)
        VM.objects.filter(image=image, revision__isnull=True).update(revision=revision)


def variants_back(apps, schema_editor):
    """Going back is possible while no image has two variants of one type (the old rule):
    revisions' other disks would have to be dropped, and a migration never drops them."""
    ImageVariant = apps.get_model("vms", "ImageVariant")
    twice = (
        ImageVariant.objects.values("image__name", "hypervisor_type")
        .annotate(n=models.Count("pk"))
        .filter(n__gt=1)
        .order_by("image__name", "hypervisor_type")
        .first()
    )
    if twice:
        raise RuntimeError(
            f"image {twice['image__name']} has {twice['n']} {twice['hypervisor_type']} variants (revisions): "
            "delete all but one before migrating back"
        )


class Migration(migrations.Migration):
    dependencies = [("vms", "0016_image_revisions")]

    operations = [migrations.RunPython(first_revisions, variants_back)]
