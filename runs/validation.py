"""Checks of what a user asks a run to do: the command, its environment, its files' paths,
its time limit. Each returns the cleaned value or raises ``ValidationError`` naming the field.
Paths are relative to the run's work directory and cannot leave it: no absolute path, no
``..``, no empty part, a short list of characters (they become guest paths and storage names)."""

import re

from django.conf import settings
from django.core.exceptions import ValidationError

PATH_PART = re.compile(r"^[A-Za-z0-9._+-]{1,100}$")
PATTERN_PART = re.compile(r"^[A-Za-z0-9._+*?\[\]-]{1,100}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
MAX_ENV = 100
MAX_ARTIFACT_PATTERNS = 20
MAX_INPUTS = 50


def _relative(value, part_re, what):
    value = str(value)
    if not value or value.startswith("/") or "\\" in value:
        raise ValidationError(f"{what} {value[:100]!r} must be a relative path inside the work directory")
    parts = value.split("/")
    for part in parts:
        if part in ("", ".", "..") or not part_re.match(part):
            raise ValidationError(
                f"{what} {value[:100]!r}: each part must be a name of letters, digits and . _ + - "
                f"(no '..', no empty part) — it cannot leave the work directory"
            )
    if len(value) > 255:
        raise ValidationError(f"{what} {value[:100]!r}… is longer than 255 characters")
    return value


def input_path(value):
    return _relative(value, PATH_PART, "input file")


def artifact_path(value):
    return _relative(value, PATH_PART, "artifact")


def artifact_patterns(patterns):
    patterns = list(patterns or [])
    if len(patterns) > MAX_ARTIFACT_PATTERNS:
        raise ValidationError({"artifacts": [f"at most {MAX_ARTIFACT_PATTERNS} patterns"]})
    try:
        return [_relative(p, PATTERN_PART, "artifact pattern") for p in patterns]
    except ValidationError as exc:
        raise ValidationError({"artifacts": exc.messages}) from None


def command(argv, script):
    """``(argv, script)``: exactly one of them, not empty, not longer than the limit."""
    argv = list(argv or [])
    script = script or ""
    if argv and script:
        raise ValidationError({"command": ["give a command or a script, not both"]})
    if not argv and not script.strip():
        raise ValidationError({"command": ["the command is empty"]})
    if argv and (not all(isinstance(a, str) for a in argv) or not argv[0].strip()):
        raise ValidationError({"command": ["a command is a list of words, the first not empty"]})
    if any("\0" in a for a in argv) or "\0" in script:
        raise ValidationError({"command": ["the command contains a NUL character"]})
    size = sum(len(a.encode()) + 1 for a in argv) + len(script.encode())
    if size > settings.RUN_COMMAND_MAX_BYTES:
        limit = settings.RUN_COMMAND_MAX_BYTES
        raise ValidationError({"command": [f"the command is {size} bytes; at most {limit} (RUN_COMMAND_MAX_BYTES)"]})
    return argv, script


def environment(env):
    env = dict(env or {})
    if len(env) > MAX_ENV:
        raise ValidationError({"env": [f"at most {MAX_ENV} variables"]})
    for name, value in env.items():
        if not ENV_NAME.match(str(name)):
            raise ValidationError({"env": [f"{str(name)[:50]!r} is not a variable name (letters, digits, _)"]})
        if not isinstance(value, str) or "\0" in value or len(value) > 4096:
            raise ValidationError({"env": [f"{name}: a value is a string of at most 4096 characters, no NUL"]})
    return env


def time_limit(seconds):
    if seconds is None:
        return settings.RUN_DEFAULT_SECONDS
    low, high = settings.RUN_MIN_SECONDS, settings.RUN_MAX_SECONDS
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not low <= seconds <= high:
        raise ValidationError({"time_limit": [f"a time limit is {low} to {high} seconds; this is {seconds}"]})
    return seconds


def keep_failed(minutes, capture):
    """Minutes a failed run's VM is kept stopped (0 to ``RUN_KEEP_FAILED_MAX_MINUTES``), and
    whether it is captured before it is destroyed (which keeps it too, for 0 minutes at least)."""
    high = settings.RUN_KEEP_FAILED_MAX_MINUTES
    minutes = minutes or 0
    if not isinstance(minutes, int) or isinstance(minutes, bool) or not 0 <= minutes <= high:
        raise ValidationError(
            {
                "keep_failed_minutes": [
                    f"a failed run's VM is kept 0 to {high} minutes (RUN_KEEP_FAILED_MAX_MINUTES); this is {minutes}"
                ]
            }
        )
    if capture and not high:
        raise ValidationError(
            {"capture_failed": ["keeping failed runs' VMs is turned off (RUN_KEEP_FAILED_MAX_MINUTES)"]}
        )
    return minutes, bool(capture)


def parse_duration(text):
    """``90``, ``90s``, ``10m``, ``2h``, ``1h30m`` → seconds (the CLI's ``--timeout``)."""
    match = re.fullmatch(r"\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s?)?\s*", str(text))
    if not match or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m)")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds
