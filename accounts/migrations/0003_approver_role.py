"""The approver role: its permission on ``Access`` and its group (as ``access.ensure_roles``
keeps them after every migrate)."""

from django.db import migrations

CODENAME, LABEL, GROUP = "approve", "Approver: approve or deny requests that need approval", "approver"


def add_role(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    ct, _ = ContentType.objects.get_or_create(app_label="accounts", model="access")
    perm, _ = Permission.objects.get_or_create(content_type=ct, codename=CODENAME, defaults={"name": LABEL})
    group, _ = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(perm)


def remove_role(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=GROUP).delete()
    apps.get_model("auth", "Permission").objects.filter(content_type__app_label="accounts", codename=CODENAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_preferences"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="access",
            options={
                "default_permissions": (),
                "managed": False,
                "permissions": [
                    ("teach", "Instructor: block allocations for their groups"),
                    ("maintain_images", "Image maintainer: capture, publish, retire their groups' images"),
                    ("operate", "Operator: node states, evacuations, plans"),
                    ("audit", "Auditor: read everything"),
                    ("approve", LABEL),
                ],
            },
        ),
        migrations.RunPython(add_role, remove_role),
    ]
