"""Saving a decision's input for replay, as hail's ``--save`` does.

Contract: `save(path, engine, request, result)` writes one JSON record (the engine's cluster
as it decided, the request, the options and the answer given) in the format of the golden
tests in ``tests/data/placement/decisions`` (`placement.serialize`), so
``serialize.replay(record)`` gives the same answer. `save_refused` does the same into the
directory named by the ``VCLMGR_SAVE_REFUSED_DECISIONS`` setting (empty: off), one file per
refused claim; a failure to write is logged, never raised (a claim must not fail for it).
"""

import json
import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from placement import serialize

log = logging.getLogger(__name__)


def record(engine, request, result, note=""):
    return serialize.decision_record(engine.snapshot(), [request], engine.options, note, results=[result])


def save(path, engine, request, result, note=""):
    text = json.dumps(record(engine, request, result, note), indent=1, sort_keys=True)
    Path(path).write_text(text + "\n")


def refused_dir():
    return settings.VCLMGR_SAVE_REFUSED_DECISIONS


def save_refused(engine, request, result):
    """Into the refused-decisions directory, if one is set; returns the path written or None."""
    directory = refused_dir()
    if not directory:
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    path = Path(directory) / f"refused-{stamp}-{uuid.uuid4().hex[:8]}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save(path, engine, request, result, note=f"refused claim: {result}")
    except OSError as error:
        log.warning("could not save the refused decision to %s: %s", path, error)
        return None
    return path
