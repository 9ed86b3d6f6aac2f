"""Raw boot of the real test guest under this machine's libvirtd + QEMU (software emulation).

    python bench/real_vm.py [--runs 5] [--boot disk,kernel] [--together 3]

For each boot mode (``disk``: SYSLINUX from the qcow2 overlay, as real images boot;
``kernel``: direct boot of the uncompressed kernel + initramfs) it times define + start of a
guest with a fresh NoCloud seed until (1) the QEMU guest agent answers ``guest-ping`` and
(2) the guest's SSH server sends its banner through the 127.0.0.1 forward, then (3) an SSH
login with the seed's key runs ``id -un``. p50 over ``--runs`` guests one after another, then
``--together`` guests started at once (p50 and the slowest), with the CPU seconds (user +
system) each guest's QEMU used until the banner: load stretches wall time, hardly CPU time.

Then (``--vclmgr``, the default) the same image through vclmgr itself: a fresh SQLite
database, the private libvirtd registered as a ``libvirt`` host (``domain_type`` qemu,
user-mode network), a real qcluster worker, and ``reservations.services.reserve`` (what the
API's POST calls) timed until the reservation is ``ready`` (the guest's SSH banner seen by
vclmgr), then an SSH login with the reservation's key; p50 over ``--runs`` and for
``--together`` at once, the staging time of the image's first (cold) and later (cached) use,
and where the time goes (p50 of each ``vm.create`` step, and settle: VM running → ready), one
at a time and at once, with vclmgr's own share: reserve → ready minus libvirt's start and the
guest's boot, measured on the same reservations (the raw runs come first, and on a shared
machine the load differs between the two phases); also the QEMU CPU seconds of its guests at
ready and the CPU that the worker (all its processes) and libvirtd spend per reservation.
``--disk-cache MODE`` sets the host's ``disk_cache`` option (e.g. ``none`` to compare).
Starts its own private libvirtd unless one from a test run is up (tests/realvm.py).
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import realvm  # noqa: E402
from tests.localkvm_inventory import kvm_guest_image, kvm_host  # noqa: E402
from tests.realvm import new_login, seed_for, ssh_run  # noqa: E402

# CPU seconds, not wall time, compare guests on a shared machine: load stretches a boot's wall
# time but hardly the CPU the emulated guest needs.
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """user + system CPU of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def session_cpu_seconds(sid):
    """CPU of every live process in session ``sid`` (a worker and the processes it forks)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def qemu_pid(name):
    """The QEMU process of domain ``name`` (libvirt passes ``-name guest=NAME,...``)."""
    needle = f"guest={name},".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    return None


def libvirtd_cpu():
    return cpu_seconds(realvm._read_pid(realvm.STATE / "libvirtd.pid"))


def one(pool, user, boot, t0=None):
    name = f"{realvm.PREFIX}bench-{user['login']}"
    t0 = time.monotonic() if t0 is None else t0
    guest = realvm.start_guest(pool, name, seed_for(user), boot)
    try:
        pid = qemu_pid(name)
        agent = guest.wait_agent(300) + guest.started - t0
        ssh = guest.wait_ssh(300) + guest.started - t0
        cpu = cpu_seconds(pid)
        assert ssh_run(guest.port, user["login"], "id -un", pkey=user["pkey"]).strip() == user["login"]
        login = time.monotonic() - t0
        return agent, ssh, login, cpu
    finally:
        realvm.remove_guest(pool, guest)


def row(label, samples, pick=statistics.median):
    cols = [pick(s[i] for s in samples) for i in range(4)]
    return f"{label:<28} {cols[0]:>10.2f} {cols[1]:>10.2f} {cols[2]:>12.2f} {cols[3]:>10.2f}"


# --- vclmgr's reserve-to-ready (a child process: its own Django settings and database) ---------


def vclmgr_child(args):
    """Runs in a child with DATABASE_URL set: prints one JSON line of measurements."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    django.setup()
    import libvirt
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from jobs.models import Job
    from provisioning.models import VM, HostImage
    from reservations import services as reservations
    from reservations.models import Reservation

    call_command("migrate", verbosity=0)
    image_info = realvm.guest_image()
    daemon = realvm.Libvirtd.acquire()
    conn = libvirt.open(daemon.uri)
    pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}bench-vclmgr", stage=False)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=realvm.ROOT,
        start_new_session=True,
        env={**os.environ, "VCLMGR_WORKERS": str(max(2, args.together)), "LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        disk_cache = {"disk_cache": args.disk_cache} if args.disk_cache else {}
        kvm_host(daemon.uri, pool.name, actor="bench", options=disk_cache, memory_mib=4096, disk_gib=50, cpu_ratio=8)
        # from its disk: vclmgr's share is the reservation minus the raw disk boot of the same run
        image = kvm_guest_image(image_info, "bench-guest", actor="bench", os="", boot="disk")
        users = [get_user_model().objects.create_user(f"bench{n}") for n in range(args.together)]

        def reserve(user):
            login = new_login()
            t0 = time.monotonic()
            reservation = reservations.reserve(
                user, image, actor=user, duration=timezone.timedelta(hours=1), ssh_key=login["public"]
            )
            while (r := Reservation.objects.select_related("vm").get(pk=reservation.pk)).status != "ready":
                if r.status in ("failed", "ended"):
                    raise RuntimeError(f"reservation {r.pk} {r.status}: {r.error}")
                time.sleep(0.05)
            ready = time.monotonic() - t0
            qemu_cpu[r.pk] = cpu_seconds(qemu_pid(r.vm.key))
            details = reservations.connection(r)
            out = ssh_run(details["port"], details["user"], "id -un", host=details["address"], pkey=login["pkey"])
            assert out.strip() == details["user"]
            return r, ready

        def end(reservation):
            reservations.end(reservation, actor="bench")
            while Reservation.objects.get(pk=reservation.pk).status != "ended":
                time.sleep(0.05)

        def steps(reservation):
            job = Job.objects.filter(opcode="vm.create", params__vm=reservation.vm_id).first()
            times = [(s["name"], timezone.datetime.fromisoformat(s["ended"])) for s in job.steps]
            out, before = {}, job.started
            for name, ended in times:
                out[name] = (ended - before).total_seconds()
                before = ended
            ready_at = reservation.history.filter(status="ready").first().at
            out["settle"] = (ready_at - VM.objects.get(pk=reservation.vm_id).updated).total_seconds()
            out["queued"] = (job.started - job.received).total_seconds()
            return out

        def own_share(ready, spent):
            # what vclmgr adds: reserve → ready minus libvirt's start and the guest's boot (the
            # raw boot's define + start → SSH banner), measured in the same run, so a machine
            # that is busier now than during the raw runs does not count as vclmgr's
            return ready - spent["start"] - spent["address"]

        serial, breakdown, qemu_cpu, serial_reservations = [], [], {}, []
        cpu0 = (session_cpu_seconds(worker.pid), libvirtd_cpu())
        for n in range(args.runs):
            reservation, ready = reserve(users[0])
            serial.append(ready)
            serial_reservations.append(reservation)
            breakdown.append(steps(reservation))
            breakdown[-1]["vclmgr"] = own_share(ready, breakdown[-1])
            end(reservation)
            if n == 0:
                staged = HostImage.objects.get()
                cold = (staged.staged_at - staged.started).total_seconds()
        cpu1 = (session_cpu_seconds(worker.pid), libvirtd_cpu())
        with ThreadPoolExecutor(args.together) as ex:
            together = list(ex.map(reserve, users))
        cpu2 = (session_cpu_seconds(worker.pid), libvirtd_cpu())
        for reservation, _ in together:
            end(reservation)
        cached = statistics.median(b["stage"] for b in breakdown[1:]) if len(breakdown) > 1 else None
        at_once = [steps(reservation) for reservation, _ in together]
        for spent, (_, ready) in zip(at_once, together, strict=True):
            spent["vclmgr"] = own_share(ready, spent)
        print(
            json.dumps(
                {
                    "qemu_cpu": statistics.median(qemu_cpu[r.pk] for r in serial_reservations),
                    "qemu_cpu_together": statistics.median(qemu_cpu[r.pk] for r, _ in together),
                    # worker (all its processes) and libvirtd CPU per reservation, reserve → ready → end
                    "worker_cpu": (cpu1[0] - cpu0[0]) / args.runs,
                    "libvirtd_cpu": (cpu1[1] - cpu0[1]) / args.runs,
                    "worker_cpu_together": (cpu2[0] - cpu1[0]) / args.together,
                    "libvirtd_cpu_together": (cpu2[1] - cpu1[1]) / args.together,
                    "first": serial[0],
                    "serial": serial,
                    "together": [t for _, t in together],
                    "stage_cold": cold,
                    "stage_cached": cached,
                    "steps": {k: statistics.median(b[k] for b in breakdown[1:] or breakdown) for k in breakdown[0]},
                    "steps_together": {k: statistics.median(b.get(k, 0) for b in at_once) for k in at_once[0]},
                }
            )
        )
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait()
        pool.close()
        conn.close()
        daemon.release()


def vclmgr_rows(args):
    with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as tmp:
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp}/db.sqlite3",
            "DEBUG": "1",
            "REDIS_URL": "",
            "VCLMGR_QUEUE_NAME": f"bench-{os.getpid()}",
        }
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--vclmgr-child",
                "--runs",
                str(args.runs),
                "--together",
                str(args.together),
                *(["--disk-cache", args.disk_cache] if args.disk_cache else []),
            ],
            env=env,
            cwd=realvm.ROOT,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    if child.returncode:
        raise SystemExit(f"vclmgr bench failed:\n{child.stderr[-4000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--boot", default="disk,kernel")
    parser.add_argument("--together", type=int, default=3)
    parser.add_argument("--no-vclmgr", action="store_true", help="only the raw boot")
    parser.add_argument("--no-raw", action="store_true", help="only vclmgr's reserve-to-ready")
    parser.add_argument("--disk-cache", help="the libvirt host's disk_cache option (default: the driver's)")
    parser.add_argument("--vclmgr-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vclmgr_child:
        return vclmgr_child(args)

    import libvirt

    image = realvm.guest_image()
    t = time.monotonic()
    daemon = realvm.Libvirtd.acquire()
    daemon_s = time.monotonic() - t
    conn = libvirt.open(daemon.uri)
    pool = realvm.Pool(conn, image, name=f"{realvm.PREFIX}bench")
    lines = []
    try:
        for boot in [] if args.no_raw else args.boot.split(","):
            serial = [one(pool, new_login(), boot) for _ in range(args.runs)]
            lines.append(row(f"{boot}: one at a time (p50)", serial))
            users = [new_login() for _ in range(args.together)]
            t0 = time.monotonic()
            with ThreadPoolExecutor(args.together) as ex:
                together = list(ex.map(lambda u, t0=t0, boot=boot: one(pool, u, boot, t0), users))
            lines.append(row(f"{boot}: {args.together} at once (p50)", together))
            lines.append(row(f"{boot}: {args.together} at once (max)", together, max))
    finally:
        pool.close()
        conn.close()
        daemon.release()
    print(f"guest image {image['dir'].name} (kernel {image['kernel']}), domain type qemu (TCG), 256 MiB, 1 vCPU")
    print(f"libvirtd ready in {daemon_s:.1f} s (0 if it was already running)")
    print(f"{'seconds from define+start':<28} {'agent ping':>10} {'SSH banner':>10} {'SSH login':>12} {'QEMU CPU':>10}")
    for line in lines:
        print(line)
    if args.no_vclmgr:
        return None
    got = vclmgr_rows(args)
    print("\nvclmgr (disk boot, user-mode network): API reserve → ready (SSH banner), then an SSH login")
    print(f"{'reserve → ready, first (cold image)':<40} {got['first']:>8.2f} s")
    print(f"{f'reserve → ready, one at a time (p50 of {args.runs})':<40} {statistics.median(got['serial']):>8.2f} s")
    print(f"{f'reserve → ready, {args.together} at once (p50)':<40} {statistics.median(got['together']):>8.2f} s")
    print(f"{f'reserve → ready, {args.together} at once (max)':<40} {max(got['together']):>8.2f} s")
    cached = f"{got['stage_cached']:.2f}" if got["stage_cached"] is not None else "-"
    print(
        f"{'QEMU CPU s at ready, one / at once (p50)':<40} {got['qemu_cpu']:>8.2f} s / {got['qemu_cpu_together']:.2f} s"
    )
    print(
        f"{'per reservation CPU s: worker / libvirtd':<40} {got['worker_cpu']:>8.2f} s / {got['libvirtd_cpu']:.2f} s "
        f"(one at a time), {got['worker_cpu_together']:.2f} s / {got['libvirtd_cpu_together']:.2f} s (at once)"
    )
    print(f"{'staging: cold / cached':<40} {got['stage_cold']:>8.2f} s / {cached} s")
    print(
        f"{f'vclmgr own share, one / {args.together} at once (p50)':<40} {got['steps']['vclmgr']:>8.2f} s / "
        f"{got['steps_together']['vclmgr']:.2f} s (reserve → ready minus libvirt start and guest boot)"
    )
    print("where the time goes (p50, s): " + ", ".join(f"{k} {v:.2f}" for k, v in got["steps"].items()))
    print(f"the same, {args.together} at once: " + ", ".join(f"{k} {v:.2f}" for k, v in got["steps_together"].items()))
    return None


if __name__ == "__main__":
    main()
