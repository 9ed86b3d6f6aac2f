"""django-q2 Schedules name their function by dotted path: those of modules that left vclmgr/
(``vclmgr.signon.retire_gone``, made by ``ldap_retire``) are pointed at the modules' new places.
Schedules that workers make when they start heal themselves; this is for the others."""

from django.db import migrations

# A frozen copy of the move (migrations never import the code they migrate).
MOVED = {
    **{f"vclmgr.{m}.": f"core.{m}." for m in (
        "events", "changelog", "bulk", "env", "errors", "reconnect", "fencing", "outbound", "yamlsafe",
        "spreadsheets", "periodic", "lifeline", "relay", "topics", "private_files", "no_store", "next_action",
        "consumers", "tasks", "models", "metrics", "api",
    )},
    **{f"vclmgr.{m}.": f"accounts.{m}." for m in (
        "access", "signon", "lockout", "tokens", "group_map", "oidc", "saml", "saml_config", "ldap_config", "forms",
    )},
    **{f"vclmgr.{m}.": f"monitoring.{m}." for m in ("health", "dashboard", "worker_health")},
    "vclmgr.rapi.": "rapi.",
}


def _rewrite(apps, table):
    Schedule = apps.get_model("django_q", "Schedule")
    for schedule in Schedule.objects.all():
        for old, new in table.items():
            if schedule.func.startswith(old):
                Schedule.objects.filter(pk=schedule.pk).update(func=new + schedule.func[len(old):])
                break


def forwards(apps, schema_editor):
    _rewrite(apps, MOVED)


def backwards(apps, schema_editor):
    _rewrite(apps, {new: old for old, new in MOVED.items()})


class Migration(migrations.Migration):
    dependencies = [
        ("vclmgr", "0005_accounts_models_moved"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
