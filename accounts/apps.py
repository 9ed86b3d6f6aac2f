from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AccountsConfig(AppConfig):
    """Sign-in, roles, API tokens. The core below asks it through what it registers here: the
    role check of websocket topics and the liveness of a socket's token."""

    name = "accounts"
    verbose_name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from axes.signals import user_locked_out
        from django.contrib.auth.signals import user_logged_in

        from accounts import access, lockout, preferences, tokens
        from core import consumers, topics

        post_migrate.connect(access.ensure_roles, sender=self, dispatch_uid="accounts.access.roles")
        user_locked_out.connect(lockout.log_lockout, dispatch_uid="accounts.lockout.log")
        user_logged_in.connect(preferences.on_login, dispatch_uid="accounts.preferences.on_login")
        topics.ROLE_CHECK.register(access.can)
        topics.register_builtin_topics()
        consumers.TOKEN_CHECK.register(tokens.is_live)
