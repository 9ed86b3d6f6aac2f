"""Instant labs on real QEMU: a pooled reservation, a cold one, and the raw libvirt equivalents,
interleaved in one run so that all four see the same load.

    python bench/instant.py [--runs 5] [--boot disk|kernel]      (root: private libvirtd)

The test guest of ``tools/guest-image/build.py`` on the private libvirtd of ``tools/localkvm.py``
(software emulation, 256 MiB, 1 vCPU, user-mode network). A child process has a fresh SQLite
database, the daemon registered as a ``libvirt`` host, a real qcluster with two workers, and
two images of the same disk: one with a warm pool (its two warm VMs built before the runs,
``warm_min`` 1 and ``warm_max`` 2 from then on, so no warm VM is built while measuring) and
one without. ``--runs`` times, one of each in turn:
  a. pooled: ``reservations.services.reserve`` (what the API's POST calls) of the pooled image,
     timed until ``ready``, then until an SSH login with the reservation's new key ran
     ``id -un``; ended, and its VM back in the pool (reverted to its warm snapshot) before the
     next measurement;
  b. cold: the same of the image without a pool (a boot), one reservation after another;
  c. raw resume: a guest of the same disk defined by hand (``tests/realvm.py``), booted once
     with a seed that makes one user, snapshotted running with its memory (libvirt's internal
     snapshot, as vclmgr's warm snapshot is); each run reverts it to that snapshot, waits for
     the guest agent's ``guest-ping``, sets a new SSH key for the user through the agent
     (``authorizedSSHKeysSet``: libvirt only, no vclmgr), waits for the SSH banner and logs in
     with the new key. Its time with the revert, and without it (from the ping): vclmgr
     reverts a pool's VM when the previous reservation ends, not when the next one takes it;
  d. raw boot: define + start of a guest with a fresh seed until the SSH login with its key
     (``bench/real_vm.py``'s run).
p50 and p90 of each; vclmgr's share: pooled − raw resume (without the revert, the same work
on the clock), cold − raw boot; where a pooled reservation's time goes (queue wait and the
warm steps of its ``vm.create``). Targets: pooled p50 < 2 s, both shares < 0.5 s.
"""

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _common import child_env, cpu_seconds, percentile, run_child, setup_django, start_qcluster, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

POLL = 0.1  # seconds between looks at the reservation's status (the raw paths' probe period)
TARGET_POOLED = 2.0
TARGET_SHARE = 0.5
SNAPSHOT = "warm"
# The steps of a reservation's vm.create spent in the driver and the guest (the rest is vclmgr's):
# resume + agent, the login handed over, the SSH banner; start, the boot to the SSH banner.
POOLED_HYPERVISOR = ("warm-resume", "warm-login", "warm-address")
COLD_HYPERVISOR = ("start", "address")


def p(values, fraction):
    return round(percentile(values, fraction), 3)


# --- raw: libvirt only ------------------------------------------------------------------------


class RawWarm:
    """A guest of the test image booted once with a seed that makes one user, snapshotted
    running with its memory; ``resume_and_login`` reverts it and logs in with a new key."""

    def __init__(self, pool, boot):
        from tests import realvm

        self.realvm = realvm
        self.pool = pool
        self.user = realvm.new_login()
        self.guest = realvm.start_guest(pool, f"{realvm.PREFIX}instant-warm", realvm.seed_for(self.user), boot)
        self.guest.wait_agent(300)
        self.guest.wait_ssh(300)
        xml = f"<domainsnapshot><name>{SNAPSHOT}</name></domainsnapshot>"
        self.snapshot = self.guest.dom.snapshotCreateXML(xml, 0)

    def resume_and_login(self):
        import libvirt_qemu

        new = self.realvm.new_login()  # only its key: the user is the seed's
        dom = self.guest.dom
        t0 = time.monotonic()
        dom.revertToSnapshot(self.snapshot, 0)
        reverted = time.monotonic()
        while True:
            try:
                libvirt_qemu.qemuAgentCommand(dom, '{"execute":"guest-ping"}', 2, 0)
                break
            except Exception:  # noqa: BLE001 (libvirtError until the agent answers)
                if time.monotonic() - t0 > 120:
                    raise
                time.sleep(0.02)
        agent = time.monotonic()
        dom.authorizedSSHKeysSet(self.user["login"], [new["public"]], 0)
        self.guest.started = t0
        self.guest.wait_ssh(120)
        banner = time.monotonic()
        out = self.realvm.ssh_run(self.guest.port, self.user["login"], "id -un", pkey=new["pkey"])
        assert out.strip() == self.user["login"], out
        done = time.monotonic()
        return {
            "revert": reverted - t0,
            "agent": agent - reverted,
            "banner": banner - t0,
            "login": done - t0,
            "login_no_revert": done - reverted,
        }

    def close(self):
        import libvirt

        flags = libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        try:
            if self.guest.dom.isActive():
                self.guest.dom.destroy()
            self.guest.dom.undefineFlags(flags)
        except libvirt.libvirtError:
            pass
        self.guest.dom = None
        self.realvm.remove_guest(self.pool, self.guest)


def raw_boot(pool, boot):
    from real_vm import one  # bench/real_vm.py's define + start → SSH login

    from tests.realvm import new_login

    t0 = time.monotonic()
    agent, banner, login, _cpu = one(pool, new_login(), boot, t0)
    return {"agent": agent, "banner": banner, "login": login}


# --- vclmgr -----------------------------------------------------------------------------------


class Vclmgr:
    def __init__(self, daemon, image_info, pool_name, boot):
        from django.contrib.auth import get_user_model

        from provisioning import services as vms
        from tests.localkvm_inventory import kvm_guest_image, kvm_host

        kvm_host(daemon.uri, pool_name, actor="bench", memory_mib=4096, disk_gib=50, cpu_ratio=8)
        self.cold_image = kvm_guest_image(image_info, "bench-cold", actor="bench", os="", boot=boot)
        self.pooled = kvm_guest_image(image_info, "bench-pooled", actor="bench", os="", boot=boot)
        self.user = get_user_model().objects.create_user("bench-user", password=os.urandom(8).hex(), is_staff=True)
        self.vms = vms
        self.cluster = None  # the qcluster's session id (its pid)

    def fill_pool(self):
        """Two warm VMs built and snapshotted; then min 1, max 2: a take leaves one warm, so
        the round builds none while measuring, and the taken one goes back after its end."""
        from provisioning import warm

        self.pooled = self.vms.update_image(self.pooled, actor="bench", warm_min=2, warm_max=2)
        t0 = time.monotonic()
        warm.fill(self.pooled)
        wait_for(lambda: self.warm_ready() >= 2, 600, "two warm VMs")
        built = time.monotonic() - t0
        self.pooled = self.vms.update_image(self.pooled, actor="bench", warm_min=1, warm_max=2)
        return built

    def warm_ready(self):
        from provisioning import warm

        size = self.vms.size_for(self.pooled)
        return sum(1 for vm in warm.takeable(self.pooled, size) if self.vms.has_warm_snapshot(vm))

    def reserve_and_login(self, image):
        from reservations import services as reservations
        from reservations.models import Reservation
        from tests.realvm import new_login, ssh_run

        login = new_login()
        cpu0 = self.cpu()
        t0 = time.monotonic()
        reservation = reservations.reserve(
            self.user, image, actor=self.user, duration=timedelta(hours=1), ssh_key=login["public"]
        )
        # As often as the raw paths probe their guests: a tighter loop would burn the CPU the
        # emulated guest boots on (a user's page is told by an event, and polls nothing).
        rows = Reservation.objects.filter(pk=reservation.pk).values_list("status", flat=True)
        while (status := rows[0]) != "ready":
            if status in ("failed", "ended"):
                r = Reservation.objects.get(pk=reservation.pk)
                raise SystemExit(f"reservation {r.pk} {r.status}: {r.error}")
            time.sleep(POLL)
        ready = time.monotonic() - t0
        r = Reservation.objects.select_related("vm").get(pk=reservation.pk)
        details = reservations.connection(r)
        out = ssh_run(details["port"], details["user"], "id -un", host=details["address"], pkey=login["pkey"])
        assert out.strip() == details["user"], out
        done = time.monotonic() - t0
        cpu = [b - a for a, b in zip(cpu0, self.cpu(), strict=True)]
        how = r.history.last().reason
        got = {"ready": ready, "login": done, "cpu": cpu, **{f"step {k}": v for k, v in self.steps(r).items()}}
        self.end(r)
        return got, how

    def cpu(self):
        """CPU seconds used so far by vclmgr's side: ``(this process, which waits as a client
        would and logs in; the qcluster's processes)``. On a loaded host of few cores, whatever
        they burn while a guest boots under emulation is taken from the guest."""
        return cpu_seconds([os.getpid()]), cpu_seconds(session=self.cluster)

    def steps(self, reservation):
        from django.utils import timezone

        from jobs.models import Job

        job = Job.objects.filter(opcode="vm.create", params__vm=reservation.vm_id).latest("pk")
        out, before = {"queued": (job.started - job.received).total_seconds()}, job.started
        for step in job.steps:
            ended = timezone.datetime.fromisoformat(step["ended"])
            out[step["name"]] = (ended - before).total_seconds()
            before = ended
        return out

    def end(self, reservation):
        from reservations import services as reservations
        from reservations.models import Reservation

        reservations.end(reservation, actor=self.user)
        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).status == "ended", 300, "the end")
        if reservation.image_id == self.pooled.pk:
            wait_for(lambda: self.warm_ready() >= 2, 300, "the VM back in the pool")


def one(args):
    """The child: every measurement, interleaved; one JSON line."""
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import libvirt

    from tests import realvm

    image_info = realvm.guest_image()
    daemon = realvm.Libvirtd.acquire()
    conn = libvirt.open(daemon.uri)
    raw_pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}instant-raw")
    vcl_pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}instant-vcl", stage=False)
    worker = start_qcluster(2)
    raw_warm = None
    try:
        from monitoring.health import live_worker_count

        wait_for(lambda: live_worker_count() >= 2, 120, "the workers")
        bench = Vclmgr(daemon, image_info, vcl_pool.name, args.boot)
        bench.cluster = worker.pid
        bench.reserve_and_login(bench.cold_image)  # stages the disk on the host: not measured
        pool_built = bench.fill_pool()
        raw_warm = RawWarm(raw_pool, args.boot)
        rows = {"pooled": [], "cold": [], "raw_resume": [], "raw_boot": []}
        ways = {"pooled": set()}
        loads = []
        for _ in range(args.runs):
            loads.append(os.getloadavg()[0])
            got, how = bench.reserve_and_login(bench.pooled)
            rows["pooled"].append(got)
            ways["pooled"].add(how.rsplit(", ", 1)[-1])
            rows["raw_resume"].append(raw_warm.resume_and_login())
            got, _how = bench.reserve_and_login(bench.cold_image)
            rows["cold"].append(got)
            cpu0 = bench.cpu()
            got = raw_boot(raw_pool, args.boot)
            rows["raw_boot"].append({**got, "cpu": [b - a for a, b in zip(cpu0, bench.cpu(), strict=True)]})
        print(
            json.dumps(
                {
                    "rows": rows,
                    "ways": {k: sorted(v) for k, v in ways.items()},
                    "pool_built": pool_built,
                    "load": loads,
                    "boot": args.boot,
                }
            ),
            flush=True,
        )
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
        if raw_warm is not None:
            raw_warm.close()
        realvm.remove_domains_on(conn, [raw_pool.path, vcl_pool.path])
        raw_pool.close()
        vcl_pool.close()
        conn.close()
        daemon.release()


def table(got, runs):
    rows = got["rows"]

    def col(kind, key):
        values = [r[key] for r in rows[kind]]
        return p(values, 0.5), p(values, 0.9)

    load = f"{min(got['load']):.1f}–{max(got['load']):.1f}"
    lines = [
        f"{runs} of each, interleaved; load average {load} on {os.cpu_count()} cores",
        f"{'seconds':<52} {'p50':>7} {'p90':>7}",
    ]
    show = [
        ("a. pooled: reserve → ready", "pooled", "ready"),
        ("a. pooled: reserve → SSH login with the new key", "pooled", "login"),
        ("b. cold: reserve → ready", "cold", "ready"),
        ("b. cold: reserve → SSH login", "cold", "login"),
        ("c. raw resume: revert → SSH login (new key)", "raw_resume", "login"),
        ("c. raw resume, revert excluded: ping → login", "raw_resume", "login_no_revert"),
        ("c. raw resume: the revert alone", "raw_resume", "revert"),
        ("d. raw boot: define + start → SSH login", "raw_boot", "login"),
    ]
    for label, kind, key in show:
        lines.append(f"{label:<52} {col(kind, key)[0]:>7.2f} {col(kind, key)[1]:>7.2f}")
    pooled, raw_resume = col("pooled", "login")[0], col("raw_resume", "login_no_revert")[0]
    cold, raw_boot = col("cold", "login")[0], col("raw_boot", "login")[0]
    share_pooled, share_cold = pooled - raw_resume, cold - raw_boot
    with_revert = pooled - col("raw_resume", "login")[0]

    def verdict(ok):
        return "met" if ok else "MISSED"

    lines += [
        f"pooled p50 {pooled:.2f} s (target < {TARGET_POOLED} s: {verdict(pooled < TARGET_POOLED)})",
        f"vclmgr's share, pooled − raw resume (p50, revert excluded): {share_pooled:+.2f} s "
        f"(target < {TARGET_SHARE} s: {verdict(share_pooled < TARGET_SHARE)}); with the revert: {with_revert:+.2f} s",
        f"vclmgr's share, cold − raw boot (p50): {share_cold:+.2f} s "
        f"(target < {TARGET_SHARE} s: {verdict(share_cold < TARGET_SHARE)})",
        "the pooled reservations' trails end: " + "; ".join(got["ways"]["pooled"]),
        f"the pool's two warm VMs built (boot, answer, snapshot) in {got['pool_built']:.1f} s",
    ]
    pairs = (("pooled", "raw_resume", "login_no_revert"), ("cold", "raw_boot", "login"))
    for kind, raw, key in pairs:
        diff = [mine["login"] - theirs[key] for mine, theirs in zip(rows[kind], rows[raw], strict=True)]
        lines.append(
            f"vclmgr's share, {kind} − {raw.replace('_', ' ')}, per run (each beside its raw run): "
            f"p50 {p(diff, 0.5):+.2f} s, p90 {p(diff, 0.9):+.2f} s"
        )
    for kind, hypervisor in (("pooled", POOLED_HYPERVISOR), ("cold", COLD_HYPERVISOR)):
        own = [r["ready"] - sum(r.get(f"step {k}", 0) for k in hypervisor) for r in rows[kind]]
        lines.append(
            f"vclmgr's own share, {kind}: reserve → ready less the driver's and guest's steps "
            f"({', '.join(hypervisor)}), per run: p50 {p(own, 0.5):.2f} s, p90 {p(own, 0.9):.2f} s"
        )
    if "cpu" in rows["cold"][0]:

        def cpu(kind, i):
            return p([r["cpu"][i] for r in rows[kind]], 0.5)

        lines.append(
            "CPU seconds (p50) of this process (waits, logs in) and the qcluster's: during a cold reservation "
            f"{cpu('cold', 0):.2f} and {cpu('cold', 1):.2f}; during a raw boot (its own wait and login, "
            f"the qcluster idle) {cpu('raw_boot', 0):.2f} and {cpu('raw_boot', 1):.2f}"
        )
    for kind in ("pooled", "cold"):
        keys = [k for k in rows[kind][0] if k.startswith("step ")]
        spent = ", ".join(f"{k[5:]} {p([r.get(k, 0) for r in rows[kind]], 0.5):.2f}" for k in keys)
        lines.append(f"where a {kind} reservation's time goes (p50, s): {spent}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--boot", default="disk", choices=("disk", "kernel"))
    parser.add_argument("--json", help="also write the measurements to this file")
    parser.add_argument("--table", help="only print the table of measurements written by --json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args)
        return
    if args.table:
        print_table(json.loads(Path(args.table).read_text()), args)
        return
    with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
        env = child_env(var, "instant")
        env["CREDENTIAL_KEY"] = base64.urlsafe_b64encode(os.urandom(32)).decode()  # reservations' logins
        print(f"running … (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        command = [sys.executable, __file__, "--one", "--runs", str(args.runs), "--boot", args.boot]
        got = run_child(command, env, "instant", timeout=3600)
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=1))
    print_table(got, args)


def print_table(got, args):
    boot = got.get("boot", args.boot)
    print(f"guest image from its {boot}, domain type qemu (TCG), 256 MiB, 1 vCPU, user-mode network")
    print(table(got, len(got["rows"]["pooled"])))


if __name__ == "__main__":
    main()
