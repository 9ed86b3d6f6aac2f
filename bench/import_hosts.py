"""Bench: bulk import of hypervisors from CSV — dry run, commit, re-import, export.

    DEBUG=1 .venv/bin/python bench/import_hosts.py [--rows 10000] [--database-url URL]

Runs on a scratch SQLite database in a temporary directory (or on the throwaway database
given by --database-url, which it migrates). Phases: dry run, commit, export, re-import of
that export (every row unchanged), an import changing every row. Each prints its wall time,
its CPU time (SQLite works inside this process, so on a busy machine, where wall times
stretch, CPU time is the figure to trust) and the process' peak resident memory.
Targets on a 2-core machine, 10,000 rows: dry run < 5 s, commit < 10 s.
"""

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_csv(rows, chassis_size=16, cpus=32):
    lines = ["name,address,driver,uri,credential,blade_center,slot,group,cpus,memory_mib,disk_gib,tags"]
    for i in range(rows):
        chassis, slot = divmod(i, chassis_size)
        address = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        lines.append(
            f"bench-{i:06d},{address},libvirt,qemu+ssh://root@{address}/system,bench-root,"
            f'bench-bc{chassis:04d},{slot + 1},bench-group,{cpus},131072,2000,"bench, rack{chassis % 8}"'
        )
    return ("\n".join(lines) + "\n").encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    scratch = tempfile.TemporaryDirectory(prefix="vclmgr-bench-")
    os.environ.setdefault("DEBUG", "1")
    os.environ["DATABASE_URL"] = args.database_url or f"sqlite:///{scratch.name}/bench.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.INVENTORY_IMPORT_MAX_ROWS = max(args.rows, 20_000)
    call_command("migrate", verbosity=0)

    from core.changelog import Actor
    from inventory import services
    from inventory.models import BladeCenter, Credential, NodeGroup

    actor = Actor(name="bench")
    services.create_credential(actor=actor, name="bench-root", username="root", secret="s3cret")  # noqa: S106
    services.create_node_group(actor=actor, name="bench-group")
    BladeCenter.objects.bulk_create(
        [BladeCenter(name=f"bench-bc{c:04d}", slot_count=16) for c in range((args.rows + 15) // 16)]
    )
    assert Credential.objects.count() and NodeGroup.objects.count()
    data = make_csv(args.rows)
    print(f"{args.rows:,} rows, {len(data) / 1e6:.1f} MB of CSV, database {settings.DATABASES['default']['ENGINE']}")
    print(f"baseline peak RSS {peak_mib():.0f} MiB")

    def phase(label, fn):
        start, cpu = time.perf_counter(), time.process_time()
        outcome = fn()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(
            f"{label:<22} {elapsed:6.2f} s wall {cpu:6.2f} s cpu   peak RSS {peak_mib():5.0f} MiB   "
            f"{getattr(outcome, 'summary', str)()}"
        )
        return outcome

    dry = phase("dry run", lambda: services.import_hypervisors(data, "csv", actor=actor, dry_run=True))
    assert dry.ok, dry.messages()[:5]
    done = phase("commit", lambda: services.import_hypervisors(data, "csv", actor=actor))
    assert done.committed, done.messages()[:5]
    exported = phase("export (csv)", lambda: services.export_hypervisors("csv"))
    again = phase("re-import of export", lambda: services.import_hypervisors(exported, "csv", actor=actor))
    assert again.totals["unchanged"] == args.rows, again.summary()
    bigger = make_csv(args.rows, cpus=48)
    changed = phase("update of every row", lambda: services.import_hypervisors(bigger, "csv", actor=actor))
    assert changed.totals["update"] == args.rows, changed.summary()
    scratch.cleanup()


if __name__ == "__main__":
    main()
