"""Plain-text tables of a topology run's result (``scenario.run``)."""


def table(rows, headers):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*(str(c) for c in row)) for row in rows]
    return "\n".join(out)


def invariants(result):
    rows = [(name, "ok" if check["ok"] else "FAILED", check["detail"]) for name, check in result["checks"].items()]
    return table(rows, ("what must hold", "", "found"))


def faults(result):
    rows = [(t["fault"], f"{t['at']}s", f"{t['seconds']}s", t["what"]) for t in result["timeline"]]
    return table(rows, ("fault", "at", "took", "what"))


def figures(results):
    """One column per run (e.g. 1 and 3 worker machines)."""
    keys = []
    for result in results:
        for key in result["figures"]:
            if key not in keys:
                keys.append(key)
    headers = ["figure", *(label for label, _ in _labelled(results))]
    rows = []
    for key in keys:
        values = []
        for _, result in _labelled(results):
            value = result["figures"].get(key, "")
            if isinstance(value, dict):
                value = ", ".join(f"{k} {v}" for k, v in value.items())
            values.append(value)
        rows.append((key, *values))
    return table(rows, headers)


def _labelled(results):
    for result in results:
        c = result["config"]
        label = f"{c['worker_machines']} worker machine{'s' if c['worker_machines'] != 1 else ''}"
        yield (label + (", faults" if c["faults"] else "")), result


def failures(result):
    """What a failed check found, for the assertion message."""
    lines = []
    for name, check in result["checks"].items():
        if not check["ok"]:
            extra = {k: v for k, v in check.items() if k not in ("ok", "detail") and v}
            lines.append(f"{name}: {check['detail']} {extra}")
    return "\n".join(lines)
