from django.apps import AppConfig
from django.core import checks


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = "Inventory"

    def ready(self):
        from core import topics

        # Live updates of one host or one chassis: operators and auditors.
        topics.AUTHORISERS.register("hypervisor", topics.cluster_readers)
        topics.AUTHORISERS.register("bladecenter", topics.cluster_readers)
        checks.register(credential_key_check, checks.Tags.security, deploy=True)


def credential_key_check(app_configs, **kwargs):
    """``manage.py check --deploy``: is the key that encrypts hypervisor credentials usable?"""
    from django.core.exceptions import ImproperlyConfigured

    from inventory import crypto

    try:
        crypto.check_key()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="inventory.E001")]
    return []
