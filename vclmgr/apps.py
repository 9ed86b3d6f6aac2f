from django.apps import AppConfig


class SiteConfig(AppConfig):
    """The project's wiring: no models, no migrations. Installed only so that Django finds the
    site's commands (serve, demo, kvm_demo); its label is not ``vclmgr``, which the core app kept."""

    name = "vclmgr"
    label = "site"
    verbose_name = "site wiring"
