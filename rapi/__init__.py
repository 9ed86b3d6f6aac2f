"""Ganeti's Remote API, version 2, under ``/2/``, so tools built for Ganeti drive vclmgr.

Thin: reads map vclmgr's rows onto Ganeti's resources (``resources``: nodes are hypervisors,
groups node groups, instances VMs, jobs jobs), writes submit jobs through the services
(``services``, ``opcodes``) and answer the job id as a JSON number, as Ganeti does. The wire
protocol — HTTP basic or bearer authentication, JSON bodies (also on GET), Ganeti's error
body ``{"code", "message", "explain"}`` — is in ``protocol``. Plain Django views, not DRF, so
nothing here enters the ``/api/v1`` schema.
"""
