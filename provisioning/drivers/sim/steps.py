"""The driver steps a fault can be injected into (``*``: every step)."""

STEPS = (
    "facts", "list_vms", "stage_image", "create", "start", "stop", "suspend", "resume",
    "destroy", "snapshot", "revert", "reseed", "capture", "migrate", "address", "state",
)  # fmt: skip
ANY = "*"
CHOICES = [(ANY, "every step")] + [(step, step) for step in STEPS]
