from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from core import events
        from notifications import services, tasks

        for kind in services.RULES:
            events.LISTENERS.register(kind, events.Listener(services.on_event, ids=True))
        events.LISTENERS.register("*", events.Listener(services.on_any_event))
        post_spawn.connect(tasks.start_sender, dispatch_uid="notifications.sender")
