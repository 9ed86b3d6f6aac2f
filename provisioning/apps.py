from django.apps import AppConfig


class VmsConfig(AppConfig):
    name = "provisioning"
    label = "vms"
    verbose_name = "Virtual machines"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from capacity import services as capacity
        from core import events, topics
        from inventory import services as inventory
        from jobs import opcodes as job_opcodes
        from provisioning import plans, quotas, services, tasks, usage, verify, warm

        post_spawn.connect(tasks.on_worker_start, dispatch_uid="provisioning.facts_refresh")

        quotas.HOLDERS.register("vm", quotas.vm_holdings)  # its own: ad-hoc VMs
        usage.SOURCES.register(usage.vm_uses)  # the same: showback counts ad-hoc VMs
        inventory.IN_USE_CHECKERS.register(services.in_use_reason)
        capacity.IMAGE_TYPES.register(services.image_types)
        capacity.ON_YIELD.register(warm.evict)  # a warm VM's claim gives way to any other
        inventory.ON_STATE_CHANGE.register(warm.host_left_service)  # a drained host's warm VMs go
        topics.AUTHORISERS.register("vm", services.may_see_vm)
        topics.AUTHORISERS.register("plan", topics.cluster_readers)
        events.LISTENERS.register("job.status", events.Listener(plans.job_ended))
        job_opcodes.VERIFY_CHECKS.register("hypervisors", verify.job_check)
