"""Provisioning: a plain package of the apps that turn requests into running VMs.

``jobs`` (the job queue, its UI, API and commands), ``vms`` (VMs and images), ``capacity``
(claims on hosts over time), ``drivers`` (hypervisor drivers), ``placement`` (the pure
placement core). It has no models, views or urls of its own.
"""
