"""ApiToken, Access and SignOnIdentity are the accounts app's now (accounts/migrations/0001_initial):
the core forgets them, their tables stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("vclmgr", "0004_signon_identity"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="ApiToken"),
                migrations.DeleteModel(name="Access"),
                migrations.DeleteModel(name="SignOnIdentity"),
            ],
        ),
    ]
