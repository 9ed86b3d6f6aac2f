"""One-time console tickets, each also the record of the console session it opened."""

from django.conf import settings
from django.db import models


class ConsoleTicket(models.Model):
    """A ticket lets one user open one console (``kind``) of one VM, once, within seconds.

    Only the SHA-256 digest of the ticket is stored (the clear ticket is handed to the browser
    once). ``used`` is when its websocket opened (the session's start), ``closed`` when it
    ended, ``seen`` when its socket last said it was still open (a heartbeat, every
    ``CONSOLE_HEARTBEAT_SECONDS``): connection tracking for the console sessions vclmgr proxies.
    A session with no close whose heartbeat stopped (its web process died) is no longer open.
    """

    class Kind(models.TextChoices):
        VNC = "vnc", "graphical (VNC)"
        SERIAL = "serial", "serial"

    digest = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="console_tickets")
    vm = models.ForeignKey("vms.VM", on_delete=models.CASCADE, related_name="console_tickets")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    used = models.DateTimeField(null=True, blank=True)
    closed = models.DateTimeField(null=True, blank=True)
    seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["vm", "used"], name="console_vm_used")]

    def __str__(self):
        return f"{self.kind} console of VM {self.vm_id} for user {self.user_id}"
