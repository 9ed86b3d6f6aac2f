"""ApiToken, Access and SignOnIdentity move here from the core app (label ``vclmgr``) without
their data: their tables stay (``db_table``), only Django's state moves (the core's
0005_accounts_models_moved forgets them). Their content types are renamed, so the roles'
permissions, the groups holding them and the change log's references stay the same rows."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import accounts.models

MOVED = ("apitoken", "access", "signonidentity")


def _relabel(apps, old, new):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not ContentType.objects.filter(app_label=new, model=model).exists():
            ContentType.objects.filter(app_label=old, model=model).update(app_label=new)


def content_types_to_accounts(apps, schema_editor):
    _relabel(apps, "vclmgr", "accounts")


def content_types_to_core(apps, schema_editor):
    _relabel(apps, "accounts", "vclmgr")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("vclmgr", "0004_signon_identity"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=100)),
                        ("prefix", models.CharField(help_text="The first characters, to recognise a token.", max_length=16)),
                        ("digest", models.CharField(max_length=64, unique=True)),
                        (
                            "scopes",
                            models.JSONField(
                                default=accounts.models.default_scopes,
                                help_text="What the token may do: read, reserve, run, operate, admin (never more than its user's roles).",
                            ),
                        ),
                        ("created", models.DateTimeField(auto_now_add=True)),
                        ("expires", models.DateTimeField(blank=True, null=True)),
                        ("last_used", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "vclmgr_apitoken",
                        "ordering": ["-created"],
                        "constraints": [
                            models.UniqueConstraint(fields=("user", "name"), name="apitoken_unique_name_per_user")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Access",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                    ],
                    options={
                        "db_table": "vclmgr_access",
                        "permissions": [
                            ("teach", "Instructor: block allocations for their groups"),
                            ("maintain_images", "Image maintainer: capture, publish, retire their groups' images"),
                            ("operate", "Operator: node states, evacuations, plans"),
                            ("audit", "Auditor: read everything"),
                        ],
                        "managed": False,
                        "default_permissions": (),
                    },
                ),
                migrations.CreateModel(
                    name="SignOnIdentity",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        (
                            "method",
                            models.CharField(
                                choices=[("ldap", "LDAP"), ("saml", "SAML"), ("oidc", "OpenID Connect")], max_length=8
                            ),
                        ),
                        (
                            "issuer",
                            models.CharField(
                                help_text="the OIDC issuer, the SAML IdP's entity ID, or 'ldap'", max_length=255
                            ),
                        ),
                        (
                            "subject",
                            models.CharField(
                                help_text="OIDC sub, SAML username, or the directory's user name", max_length=255
                            ),
                        ),
                        ("created", models.DateTimeField(auto_now_add=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="signon_identities",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "vclmgr_signonidentity",
                        "constraints": [
                            models.UniqueConstraint(fields=("issuer", "subject"), name="signon_identity_unique")
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(content_types_to_accounts, content_types_to_core),
    ]
