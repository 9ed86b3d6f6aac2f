"""What reaching a BMC can fail with, apart from the Redfish client (``inventory.redfish``), so
that a process which never reaches a BMC need not import that client (sushy: most of a
second of every worker's and command's start)."""


class BMCError(Exception):
    """The BMC could not be used; ``kind``: ``auth`` (login refused), ``unreachable`` (no answer,
    TLS failure), ``refused`` (it answered, but said no), ``timeout`` (never reached the state)."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind
