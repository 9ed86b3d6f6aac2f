"""Capacity claims: the database side of placement.

``Allocation`` rows are the truth about what each host has promised and over which time
window. ``loaders`` turn rows into the pure core's ``Cluster``; ``services`` plans (no
writes) and claims (writes an Allocation after re-checking the chosen host under a lock),
and releases.
"""
