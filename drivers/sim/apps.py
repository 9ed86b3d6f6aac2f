from django.apps import AppConfig


class SimConfig(AppConfig):
    """The simulated hypervisor keeps its state in the database, so every process sees it."""

    name = "drivers.sim"
    label = "simhv"
    verbose_name = "Simulated hypervisors"
