"""QuotaRule, taken over from the reservations app with its table (state only), and its
content type (so the permissions given on it still hold)."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


def move_content_type(apps, schema_editor, old="reservations", new="vms"):
    content_types = apps.get_model("contenttypes", "ContentType")
    if not content_types.objects.filter(app_label=new, model="quotarule").exists():
        content_types.objects.filter(app_label=old, model="quotarule").update(app_label=new)


def move_back(apps, schema_editor):
    move_content_type(apps, schema_editor, old="vms", new="reservations")


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("reservations", "0002_quotarule_moves_to_vms"),
        ("vms", "0006_image_readiness"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="QuotaRule",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=100, unique=True)),
                        ("max_duration_minutes", models.PositiveIntegerField(blank=True, null=True, validators=[django.core.validators.MinValueValidator(1)])),
                        ("max_per_user", models.PositiveIntegerField(blank=True, help_text="Concurrent reservations of one member.", null=True)),
                        ("max_per_group", models.PositiveIntegerField(blank=True, help_text="Concurrent reservations of all members together.", null=True)),
                        ("group", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="auth.group")),
                        ("image", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="vms.image")),
                    ],
                    options={"ordering": ["name"], "db_table": "reservations_quotarule"},
                ),
            ],
        ),
        migrations.RunPython(move_content_type, move_back),
    ]
