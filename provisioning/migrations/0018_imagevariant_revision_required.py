import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("vms", "0017_image_revision_one")]

    operations = [
        migrations.AlterField(
            model_name="imagevariant",
            name="revision",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="variants", to="vms.imagerevision"
            ),
        ),
        migrations.AddConstraint(
            model_name="imagevariant",
            constraint=models.UniqueConstraint(
                fields=("revision", "hypervisor_type"), name="imagevariant_one_per_type"
            ),
        ),
    ]
