"""Strict readers for environment settings.

Every value is validated where it is read, so a bad value stops the start with a message
naming the variable instead of failing later somewhere far away. A variable ``NAME`` may
also be given as ``NAME_FILE`` (a path whose content is the value), for secrets mounted as
files.
"""

import json
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_UNSET = object()


def driver_options_errors(value, kinds):
    """Why ``value`` is not an object of option objects keyed by driver kind (one of ``kinds``),
    or None: the shape of ``VCLMGR_DRIVER_OPTIONS``, checked by the settings (which name the kinds
    without importing the drivers) and by the driver registry (which owns them)."""
    if not isinstance(value, dict):
        return f"expected a JSON object of driver kinds ({', '.join(kinds)}), got {type(value).__name__}"
    unknown = sorted(set(value) - set(kinds))
    if unknown:
        return f"unknown driver {unknown[0]!r} (one of {', '.join(kinds)})"
    for name, options in value.items():
        if not isinstance(options, dict):
            return f"the options of {name} must be a JSON object, got {type(options).__name__}"
    return None


def price_map_errors(value, units):
    """Why ``value`` is no map of unit → price (a number ≥ 0, units among ``units``), or None."""
    if not isinstance(value, dict):
        return f'expected a JSON object of unit → price, e.g. {{"vcpu_hour": 0.01}}, got {value!r}'
    for unit, price in value.items():
        if unit not in units:
            return f"unknown unit {unit!r} (units: {', '.join(units)})"
        if isinstance(price, bool) or not isinstance(price, int | float) or price < 0 or price != price:
            return f"{unit}: a price is a number ≥ 0, got {price!r}"
    return None


class Env:
    def __init__(self, environ=None):
        self.environ = os.environ if environ is None else environ

    def raw(self, name):
        """The value of NAME, else the content of the file named by NAME_FILE, else None."""
        if name in self.environ:
            return self.environ[name]
        path = self.environ.get(f"{name}_FILE")
        if path is None:
            return None
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {path}: {exc.strerror}") from exc

    def str(self, name, default=_UNSET):
        value = self.raw(name)
        if value is None:
            if default is _UNSET:
                raise ImproperlyConfigured(f"{name} is required")
            return default
        return value

    def bool(self, name, default):
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ImproperlyConfigured(f"{name}: expected a boolean (1/0, true/false, yes/no), got {value!r}")

    def choice(self, name, choices, default):
        value = self.str(name, default).strip().lower()
        if value not in choices:
            raise ImproperlyConfigured(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
        return value

    def int(self, name, default, minimum=None, maximum=None):
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: expected an integer, got {value!r}") from None
        if minimum is not None and number < minimum:
            raise ImproperlyConfigured(f"{name}: must be at least {minimum}, got {number}")
        if maximum is not None and number > maximum:
            raise ImproperlyConfigured(f"{name}: must be at most {maximum}, got {number}")
        return number

    def float(self, name, default, minimum=None, maximum=None):
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: expected a number, got {value!r}") from None
        if minimum is not None and number < minimum:
            raise ImproperlyConfigured(f"{name}: must be at least {minimum}, got {number}")
        if maximum is not None and number > maximum:
            raise ImproperlyConfigured(f"{name}: must be at most {maximum}, got {number}")
        return number

    def list(self, name, default):
        value = self.raw(name)
        if value is None:
            return list(default)
        return [item.strip() for item in value.split(",") if item.strip()]

    def mapping(self, name, default):
        """``"key=value;key=value"`` (values may hold spaces and ``=``) as a dict."""
        value = self.raw(name)
        if value is None:
            return dict(default)
        out = {}
        for item in filter(None, (part.strip() for part in value.split(";"))):
            key, sep, val = item.partition("=")
            if not sep or not key.strip() or not val.strip():
                raise ImproperlyConfigured(f"{name}: expected name=value;name=value, got {item!r}")
            out[key.strip()] = val.strip()
        return out

    def json(self, name, default, check=None):
        """A JSON value; ``check(value)`` returns why it is unacceptable (or None). Blank means the default."""
        value = self.raw(name)
        if value is None or not value.strip():
            return default
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: invalid JSON ({exc})") from None
        problem = check(parsed) if check is not None else None
        if problem:
            raise ImproperlyConfigured(f"{name}: {problem}")
        return parsed

    def url(self, name, schemes, default=None):
        value = self.raw(name)
        if value is None or value == "":
            return default
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in schemes:
            allowed = ", ".join(sorted(schemes))
            raise ImproperlyConfigured(f"{name}: unsupported URL scheme {scheme!r} (use one of: {allowed})")
        return value
