"""Provisioning: the app that turns requests into running VMs — images, VMs, the VM opcodes.

Its label is ``vms`` (tables ``vms_*``, its content types, migrations and permissions): the
label it had as the ``vms`` folder of a plain package that also held the layers below it
(``placement``, ``jobs``, ``drivers``, ``capacity``, top-level packages now), kept so that no
data moves.
"""
