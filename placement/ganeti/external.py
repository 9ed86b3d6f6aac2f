"""The ``external`` placement policy: ask a program speaking Ganeti's IAllocator protocol.

Contract: `run_iallocator(program, request, timeout)` writes the request to a temporary
file, runs ``program FILE`` (as Ganeti runs hail) and returns the parsed one-line JSON
answer; a crash, timeout or malformed answer raises `ExternalAllocatorError`.
`choose_external` is the engine's hook: it describes the candidate hosts' usage over the
request's window, runs the program, and accepts its pick only if our own checks agree.
This is the one place the placement core does I/O, and only when the policy asks for it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile

from ..model import Policy
from ..search import Choice, evaluate


class ExternalAllocatorError(RuntimeError):
    pass


def run_iallocator(program: str, request: dict, timeout: float = 60.0) -> dict:
    """``program`` may carry options: ``"/usr/lib/.../hail --no-capacity-checks"``."""
    argv = shlex.split(program)
    fd, path = tempfile.mkstemp(prefix="iallocator-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(request, handle)
        try:
            done = subprocess.run([*argv, path], capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExternalAllocatorError(f"{program}: {exc}") from exc
    finally:
        os.unlink(path)
    if done.returncode != 0:
        raise ExternalAllocatorError(f"{program} exited {done.returncode}: {done.stderr.strip()[:500]}")
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise ExternalAllocatorError(f"{program}: malformed answer: {done.stdout[:200]!r}") from exc
    if not isinstance(answer, dict) or "success" not in answer:
        raise ExternalAllocatorError(f"{program}: not an IAllocator answer: {answer!r}")
    return answer


def choose_external(engine, request, window, hosts) -> tuple[Choice | None, str]:
    """Placement hook for `PlacementEngine` (policy ``external``)."""
    from .bridge import iallocator_request

    state = engine.state
    slots = [state.slots[i] for i in hosts]
    group = state.groups[slots[0].host.group] if slots else None
    program = (group.iallocator if group else None) or engine.options.iallocator
    if not program:
        return None, "external policy without an iallocator program"
    usage = {s.name: window.peak(state, s) for s in state.slots}
    eligible = {s.name for s in slots if s.idx not in window.blocked}
    body = iallocator_request(state.cluster, request, usage, eligible)
    try:
        answer = run_iallocator(program, body, engine.options.external_timeout)
    except ExternalAllocatorError as exc:
        return None, f"external allocator failed: {exc}"
    info = str(answer.get("info", ""))
    result = answer.get("result") or []
    if not answer.get("success") or not result:
        return None, f"external allocator: {info}"
    name = result[0]
    idx = state.by_name.get(name)
    if idx is None or idx not in set(hosts):
        return None, f"external allocator chose {name!r}, which is not eligible"
    score = evaluate(state, window, idx, Policy.BALANCED)
    if score is None:
        return None, f"external allocator chose {name!r}, which lacks capacity in the window"
    return Choice(idx, score), f"external allocator: {info}"
