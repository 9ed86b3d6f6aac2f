"""The driver steps a fault can be injected into (``*``: every step)."""

STEPS = (
    "facts", "list_vms", "stage_image", "create", "start", "stop", "suspend", "resume",
    "destroy", "snapshot", "revert", "reseed", "resize", "capture", "migrate", "address", "state",
    "guest_exec", "guest_exec_status", "guest_put_file", "guest_get_file", "guest_glob", "guest_sessions",
    "personalise", "create_network", "delete_network", "list_networks",
)  # fmt: skip
ANY = "*"
CHOICES = [(ANY, "every step")] + [(step, step) for step in STEPS]
