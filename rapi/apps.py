from django.apps import AppConfig


class RapiConfig(AppConfig):
    name = "rapi"
    label = "rapi"
    verbose_name = "Ganeti RAPI"
    default_auto_field = "django.db.models.BigAutoField"
