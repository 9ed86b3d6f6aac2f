"""The Ganeti-style commands (hspace, hbal, hsqueeze) in one implementation, without Django.

Contract: `add_arguments(name, parser)` defines a command's options; `run(name, opts, load,
write)` does its work with ``opts`` as argparse (or Django's ``call_command``) gives them,
``load(template, hold_future)`` returning the cluster and ``write(text)`` printing one
line; a refusal raises `CommandFailed` after printing what the command prints before it.
The management commands (``manage.py hspace``…) call these with a loader that can also read
the live inventory; `main` runs them on a Ganeti text file (``-t``) or ``--simulate`` specs,
which need no database, so Django is never set up.

`console` is the ``htools`` command (pyproject's console script; like Ganeti's multi-call
binary): ``htools hspace|hbal|hsqueeze [options]`` takes that path when the arguments allow
(`runs_without_django`) — Django's start-up costs more than Ganeti's whole run on a small
cluster — and hands anything else (the live inventory, ``-X``, Django's options) to the
management command. Only the standard library and `placement` are imported here, and those
lazily, per command.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

COMMANDS = ("hspace", "hbal", "hsqueeze")

#: As `placement.ganeti.types.DISK_TEMPLATES` (held to it by a test): the
#: help text needs them before anything of the placement core is imported.
_DISK_TEMPLATES = "diskless, file, sharedfile, plain, blockdev, drbd, rbd, ext, gluster"


class CommandFailed(Exception):
    """The command refuses: Django's CommandError (``CommandError: …`` on stderr, exit 1)."""


# ---------------------------------------------------------------------- arguments
#
# Each command's options, as ``(flags, add_argument keywords)``: `add_arguments` hands them
# to argparse (or Django's parser); `parse_simple` reads the plain spellings itself, so that
# a run on a file or a simulation does not import argparse (with `re`, `enum`, `gettext`
# and `shutil`, a tenth of Ganeti's whole hspace run on a small cluster) and leaves
# anything else to argparse.

_SOURCE = (
    (("-t", "--ganeti-file"), {"help": "a Ganeti htools text-backend cluster file"}),
    (("--at",), {"help": "answer for this moment, given the reservations ('2026-12-01 14:00', UTC)"}),
)
_SIMULATE = (
    (("--simulate",), {"action": "append", "default": [], "metavar": "p,NODES,DISK,MEM,CPUS",
                       "help": "a simulated node group (repeatable), as Ganeti's hspace"}),
)  # fmt: skip

_OPTIONS = {
    "hspace": _SOURCE + _SIMULATE + (
        (("--tiered-alloc",), {"metavar": "DISK,MEM,CPUS", "help": "start at this spec and shrink"}),
        (("--standard-alloc",), {"metavar": "DISK,MEM,CPUS", "help": "fixed spec until the first refusal"}),
        (("--disk-template",), {"default": "plain", "help": f"{_DISK_TEMPLATES} (default plain)"}),
        (("--no-capacity-checks",), {"action": "store_true", "help": "skip the N+1 re-creatability check"}),
        (("--machine-readable",), {"action": "store_true", "help": "HTS_ key=value lines, as hspace"}),
        (("--json",), {"action": "store_true"}),
    ),
    "hbal": _SOURCE + (
        (("-G", "--group"), {"metavar": "NAME", "help": "the node group to balance (name or UUID), as hbal"}),
        (("--max-moves",), {"type": int, "default": -1, "help": "stop after N moves (default: converge)"}),
        (("-C", "--print-commands"), {"nargs": "?", "const": "-", "metavar": "FILE",
         "help": "print the gnt-instance job sets (or write hbal's shell script to FILE)"}),
        (("--strategy",), {
            "choices": ("ganeti", "auto", "steepest", "lazy", "both"),
            "default": "ganeti",
            "help": "steepest: Ganeti's own path (the best move every round); lazy: re-rank candidates "
            "lazily (for very large clusters); both: keep the better end; auto: both on small "
            "clusters, steepest up to 50,000 candidate moves, else lazy; ganeti (default): "
            "steepest up to 50,000 candidate moves, else lazy — Ganeti's hbal output",
        }),
        (("--json",), {"action": "store_true"}),
    ),
    "hsqueeze": _SOURCE + (
        # --target-resources is hsqueeze's spelling; --target-util is kept as an alias.
        (("--target-resources", "--target-util"), {"dest": "target_resources", "type": float, "default": 2.0,
         "help": "free capacity to keep, in standard instances per host (as hsqueeze)"}),
        (("--minimal-resources",), {"type": float, "default": 2.0,
         "help": "below this free capacity per host, bring hosts back (as hsqueeze)"}),
        (("--json",), {"action": "store_true"}),
    ),
}  # fmt: skip


def add_arguments(name: str, parser) -> None:
    for flags, keywords in _OPTIONS[name]:
        parser.add_argument(*flags, **keywords)


def _dest(flags: tuple[str, ...], keywords: dict) -> str:
    """argparse's ``dest``: given, else the first long flag (else the first), dashes to _."""
    if "dest" in keywords:
        return keywords["dest"]
    longs = [f for f in flags if f.startswith("--")]
    return (longs or flags)[0].lstrip("-").replace("-", "_")


def parse_simple(name: str, args: list[str]) -> dict | None:
    """``vars(parser.parse_args(args))`` for the parser `add_arguments` builds, when every
    argument is spelled plainly (whole option names, ``--opt=value``, ``--opt value``,
    ``-tVALUE``, ``-t VALUE``); None when anything else comes up (abbreviations, values
    that start with a dash, ``--``, unknown options, bad values): argparse then decides."""
    opts, by_flag = _defaults(name)
    appended: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--"):
            flag, equals, explicit = arg.partition("=")
            explicit = explicit if equals else None
        elif arg.startswith("-") and len(arg) > 1 and "=" not in arg:
            flag, explicit = arg[:2], arg[2:] or None
        else:
            return None  # a positional argument, "-", "--": argparse's to judge
        if flag not in by_flag:
            return None
        dest, keywords = by_flag[flag]
        if keywords.get("action") == "store_true":
            if explicit is not None:
                return None
            opts[dest] = True
            continue
        if explicit is None:
            if i < len(args) and not args[i].startswith("-"):
                explicit = args[i]
                i += 1
            elif keywords.get("nargs") == "?":
                opts[dest] = keywords["const"]
                continue
            else:
                return None
        value = _value(keywords, explicit)
        if value is _BAD:
            return None
        if keywords.get("action") == "append":
            if dest not in appended:  # argparse appends to a copy of the default
                opts[dest] = list(opts[dest] or [])
                appended.add(dest)
            opts[dest].append(value)
        else:
            opts[dest] = value
    return opts


def _defaults(name: str) -> tuple[dict, dict]:
    """Each option's default (by dest), and (dest, keywords) by flag."""
    opts: dict = {}
    by_flag: dict[str, tuple[str, dict]] = {}
    for flags, keywords in _OPTIONS[name]:
        dest = _dest(flags, keywords)
        default = keywords.get("default", False if keywords.get("action") == "store_true" else None)
        opts[dest] = list(default) if isinstance(default, list) else default
        for flag in flags:
            by_flag[flag] = (dest, keywords)
    return opts, by_flag


_BAD = object()


def _value(keywords: dict, text: str):
    """``text`` converted and checked as argparse would, or `_BAD`."""
    value = text
    if "type" in keywords:
        try:
            value = keywords["type"](text)
        except ValueError:
            return _BAD
    if "choices" in keywords and value not in keywords["choices"]:
        return _BAD
    return value


# ---------------------------------------------------------------------- sources


def file_cluster(opts: dict):
    """The cluster of ``--simulate`` or ``-t FILE``, or None when neither is given."""
    if opts.get("simulate"):
        from placement.ganeti.simulate import simulated_cluster

        try:
            return simulated_cluster(opts["simulate"])
        except ValueError as error:
            raise CommandFailed(f"--simulate: {error}") from None
    if opts.get("ganeti_file"):
        from placement.ganeti import text_backend

        path = opts["ganeti_file"]
        try:
            with open(path) as handle:  # not pathlib: its import costs start-up time
                text = handle.read()
        except OSError as error:
            raise CommandFailed(f"cannot read {path}: {error.strerror}") from None
        try:
            return text_backend.parse(text)
        except ValueError as error:
            raise CommandFailed(f"{path}: {error}") from None
    return None


# ---------------------------------------------------------------------- the commands

if TYPE_CHECKING:
    Loader = Callable[[str, bool], object]
    Writer = Callable[[str], None]


def run(name: str, opts: dict, load: Loader, write: Writer) -> None:
    _COMMANDS[name](opts, load, write)


def hspace(opts: dict, load: Loader, write: Writer) -> None:
    from placement.ganeti import types as T
    from placement.ganeti.allocation import AllocError
    from placement.ganeti.hspace import HSpaceError, HSpaceOptions, Spec, run_hspace

    specs = {}
    for option in ("tiered_alloc", "standard_alloc"):
        try:
            specs[option] = Spec.parse(opts[option]) if opts[option] else None
        except ValueError as error:
            raise CommandFailed(f"--{option.replace('_', '-')}: {error}") from None
    template = opts["disk_template"]
    if template not in T.DISK_TEMPLATES:  # as hspace: refused before any work
        raise CommandFailed(
            f'--disk-template: Invalid string value for type DiskTemplate: "{template}"'
            f" (one of {', '.join(T.DISK_TEMPLATES)})"
        )
    cluster = load(template, False)
    options = HSpaceOptions(
        disk_template=template,
        tiered=specs["tiered_alloc"],
        standard=specs["standard_alloc"],
        capacity=not opts["no_capacity_checks"],
    )
    try:
        result = run_hspace(cluster, options)
    except HSpaceError as error:
        # As hspace: what it printed before the failure, then the error, exit status 1.
        if opts["machine_readable"]:
            write("\n".join(error.lines))
        elif not opts["json"]:
            write("\n".join(error.summary_lines))
        raise CommandFailed(f"failure during allocation: {error}") from None
    except (AllocError, ValueError) as error:
        raise CommandFailed(str(error)) from None
    if opts["machine_readable"]:
        try:
            write("\n".join(result.hts_lines()))
        except HSpaceError as error:
            write("\n".join(error.lines))
            raise CommandFailed(str(error)) from None
    elif opts["json"]:
        import json

        write(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        write(result.summary())


def hbal(opts: dict, load: Loader, write: Writer) -> None:
    from placement.ganeti.hbal import HbalOptions, balance, ganeti_report, optimal_score

    if opts["max_moves"] < -1:
        raise CommandFailed(f"--max-moves must be 0 or more (or -1: converge), got {opts['max_moves']}")
    # Live VMs migrate to any host (shared-storage semantics in Ganeti's terms).
    cluster = load("ext", True)
    if not cluster.instances:  # as hbal, before it looks at the groups
        write("Cluster is empty, exiting.")
        return
    group = opts["group"]
    names = [cluster.groups[g].name for g in sorted({n.group for n in cluster.nodes})]
    if group is not None and not any(group in (g.name, g.uuid) for g in cluster.groups):
        raise CommandFailed(f"Node group {group} not found. Node group list is: {', '.join(names)}")
    if group is None and len(names) > 1:
        raise CommandFailed(f"Found multiple node groups: {', '.join(names)}; choose one with -G/--group")
    try:
        # As hbal: stop at the floor the DRBD reservations allow (none when it is reached).
        floor = optimal_score(cluster, group) + 1e-9  # hbal's default --min-score
        options = HbalOptions(max_moves=opts["max_moves"], strategy=opts["strategy"], group=group, min_score=floor)
        result = balance(cluster, options)
    except (KeyError, ValueError) as error:
        raise CommandFailed(error.args[0] if error.args else str(error)) from None
    if opts["json"]:
        import json

        write(json.dumps(result.to_dict(), indent=2))
        return
    # Ganeti's hbal text, byte for byte (the planner's own `MoveStep.line` is not it).
    write("\n".join(ganeti_report(cluster, result, group, opts["print_commands"])))


def hsqueeze(opts: dict, load: Loader, write: Writer) -> None:
    from placement.ganeti.hsqueeze import squeeze

    for option in ("target_resources", "minimal_resources"):
        value = opts[option]
        if not value > 0 or value == float("inf"):  # also refuses nan and inf
            raise CommandFailed(f"--{option.replace('_', '-')} must be a positive number, got {value}")
    cluster = load("ext", True)
    result = squeeze(cluster, target_resources=opts["target_resources"], minimal_resources=opts["minimal_resources"])
    if opts["json"]:
        import json

        write(json.dumps(result.to_dict(), indent=2))
        return
    if result.action == "none":
        write("Nothing to do: no host can be emptied, none needs to come back.")
        return
    verb = "Power off" if result.action == "offline" else "Bring back online"
    write(f"{verb}: {', '.join(result.nodes)}")
    for number, step in enumerate(result.moves, start=1):
        write(step.line(number))


_COMMANDS = {"hspace": hspace, "hbal": hbal, "hsqueeze": hsqueeze}


# ---------------------------------------------------------------------- without Django

#: Django's own command options: given any of them, htools goes the Django way.
_DJANGO_OPTIONS = (
    "--version", "-v", "--verbosity", "--settings", "--pythonpath", "--traceback",
    "--no-color", "--force-color", "--skip-checks", "-h", "--help",
)  # fmt: skip


def runs_without_django(argv: list[str]) -> bool:
    """``htools`` arguments (without the program) that `main` answers exactly as the
    management command would: one of `COMMANDS` reading a file or a simulation."""
    if not argv or argv[0] not in COMMANDS:
        return False
    args = argv[1:]
    if any(a == opt or a.startswith(opt + "=") for a in args for opt in _DJANGO_OPTIONS):
        return False
    if any(a.startswith("-v") for a in args):  # -v2, -v 2
        return False
    sources = ("-t", "--ganeti-file") + (("--simulate",) if argv[0] == "hspace" else ())
    return any(a == s or a.startswith(s + "=") or (s == "-t" and a.startswith("-t")) for a in args for s in sources)


def _parse(name: str, args: list[str], prog: str | None, from_manage: bool) -> dict | None:
    """argparse's reading of ``args`` (or its error); ``from_manage``, None on an error."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            if from_manage:
                raise _BadArguments(message)
            super().error(message)

    parser = Parser(prog=f"{prog or 'htools'} {name}")
    add_arguments(name, parser)
    try:
        return vars(parser.parse_args(args))
    except _BadArguments:
        return None


class _BadArguments(Exception):
    pass


def main(argv: list[str] | None = None, prog: str | None = None, from_manage: bool = False) -> int | None:
    """Run one command; returns the exit status. ``from_manage``: arguments that do not
    parse return None, so that `console` lets Django answer them (its usage text)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: {prog or 'htools'} {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    name = argv[0]
    opts = parse_simple(name, argv[1:])
    if opts is None:
        opts = _parse(name, argv[1:], prog, from_manage)
        if opts is None:
            return None
    if "numpy" not in sys.modules:
        # hbal's steepest descent imports numpy, whose OpenBLAS starts a thread per core at
        # import (a third of numpy's import time); these commands never call BLAS.
        import os  # already loaded by Python's start-up

        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    out = sys.stdout

    def write(text: str) -> None:
        # As Django's OutputWrapper: each write ends with one newline.
        out.write(text if text.endswith("\n") else text + "\n")

    def load(template: str, hold_future: bool):
        cluster = file_cluster(opts)
        if cluster is None:
            raise CommandFailed("give -t FILE or --simulate (the live inventory needs manage.py)")
        return cluster

    # A run builds many small objects and frees them by reference counting; the cycle
    # collector's passes over them found nothing, at a tenth of a small run's time.
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        run(name, opts, load, write)
    except CommandFailed as error:
        out.flush()
        print(f"CommandError: {error}", file=sys.stderr)
        return 1
    finally:
        if collecting:
            gc.enable()
    return 0


def exit_now(status: int) -> None:
    """End the process with ``status`` once the output is out, skipping the interpreter's
    tear-down (freeing every object and module one by one: a tenth of a small run; nothing
    of these commands needs it: no files open for writing, no atexit work). When the output
    cannot be flushed (a closed pipe), the ordinary exit reports it."""
    import os  # already loaded by Python's start-up

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(status)
    os._exit(status)


def console(argv: list[str] | None = None) -> int | None:
    """The ``htools`` command: a file or a simulation answered here; anything else by
    ``manage.py`` with the same arguments (through Django, which sets itself up)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        return main(argv, prog="htools")  # the usage line, status 2
    if runs_without_django(argv):
        status = main(argv, prog="htools", from_manage=True)
        if status is not None:  # None: argparse refused them; Django's parser says how
            exit_now(status)
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *argv])
    return None


if __name__ == "__main__":
    sys.exit(console())
