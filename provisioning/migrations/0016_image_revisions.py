import django.core.validators
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    """Image revisions, their columns nullable for now: ``0017`` fills them, ``0018`` makes a
    variant's revision required (apart, so PostgreSQL alters no table with rows pending)."""

    dependencies = [
        ("vms", "0015_moved_task_paths"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ImageRevision",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField(validators=[django.core.validators.MinValueValidator(1)])),
                (
                    "state",
                    models.CharField(
                        choices=[("testing", "testing"), ("production", "production"), ("retired", "retired")],
                        default="testing",
                        max_length=12,
                    ),
                ),
                ("created", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ("comment", models.TextField(blank=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "image",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="revisions", to="vms.image"
                    ),
                ),
                (
                    "parent",
                    models.ForeignKey(
                        blank=True,
                        help_text="Made from.",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="children",
                        to="vms.imagerevision",
                    ),
                ),
            ],
            options={"ordering": ["image", "number"]},
        ),
        migrations.AddConstraint(
            model_name="imagerevision",
            constraint=models.UniqueConstraint(fields=("image", "number"), name="imagerevision_number"),
        ),
        migrations.AddConstraint(
            model_name="imagerevision",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state", "production")), fields=("image",), name="imagerevision_one_production"
            ),
        ),
        migrations.AlterModelOptions(
            name="imagevariant",
            options={"ordering": ["image", "revision", "hypervisor_type"]},
        ),
        migrations.RemoveConstraint(model_name="imagevariant", name="imagevariant_one_per_type"),
        migrations.AddField(
            model_name="imagevariant",
            name="revision",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="variants",
                to="vms.imagerevision",
            ),
        ),
        migrations.AddField(
            model_name="vm",
            name="revision",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="vms",
                to="vms.imagerevision",
            ),
        ),
    ]
