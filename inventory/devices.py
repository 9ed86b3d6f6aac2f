"""A host's PCI devices that placement counts: GPUs and mediated-device (vGPU) types.

``Hypervisor.devices`` is a JSON list of records, one per model of device the host has::

    [{"kind": "gpu", "vendor": "nvidia", "model": "nvidia-a100", "count": 2},
     {"kind": "mdev", "vendor": "nvidia", "model": "nvidia-t4-2q", "count": 8,
      "addresses": ["0000:3b:00.0"]}]

``kind``: ``gpu`` (a whole device passed through) or ``mdev`` (a vGPU type: ``count`` is how
many instances of that type the host can create). ``model`` is the name requests ask for
(``gpus: 2, gpu_model: nvidia-a100``); ``addresses`` (optional) are the PCI addresses, for the
record only. The driver's facts fill the list at discovery and refresh (a driver that cannot
tell leaves it as the admin set it); placement counts ``count`` per ``model``, over time.
"""

import re

from django.core.exceptions import ValidationError

KINDS = ("gpu", "mdev")
FIELDS = {"kind", "vendor", "model", "count", "addresses"}
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_COUNT = 1024


def device_errors(value):
    """Why ``value`` is not a valid device list (a message), or None."""
    if not isinstance(value, list):
        return f"must be a JSON list of devices, not {type(value).__name__}"
    seen = set()
    for i, record in enumerate(value, start=1):
        if not isinstance(record, dict):
            return f"device {i}: must be an object"
        unknown = sorted(set(record) - FIELDS)
        if unknown:
            return f"device {i}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})"
        if record.get("kind", "gpu") not in KINDS:
            return f"device {i}: kind must be one of {', '.join(KINDS)}"
        model = record.get("model")
        if not isinstance(model, str) or not MODEL_RE.match(model):
            return f"device {i}: model must be a name of letters, digits, '.', '_' or '-'"
        count = record.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_COUNT:
            return f"device {i}: count must be a whole number from 0 to {MAX_COUNT}"
        if model in seen:
            return f"device {i}: model {model} is listed twice"
        seen.add(model)
    return None


def validate_devices(value):
    error = device_errors(value)
    if error:
        raise ValidationError(error)


def gpu_counts(devices):
    """Model → how many the host has (whole GPUs and vGPU instances alike)."""
    counts = {}
    for record in devices or ():
        count = record.get("count", 1)
        if count:
            counts[record["model"]] = counts.get(record["model"], 0) + count
    return counts
