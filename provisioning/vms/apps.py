from django.apps import AppConfig


class VmsConfig(AppConfig):
    name = "provisioning.vms"
    label = "vms"
    verbose_name = "Virtual machines"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from inventory import services as inventory
        from provisioning.vms import services
        from vclmgr import topics

        if services.in_use_reason not in inventory.IN_USE_CHECKERS:
            inventory.IN_USE_CHECKERS.append(services.in_use_reason)
        topics.register("vm", services.may_see_vm)
