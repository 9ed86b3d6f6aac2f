"""Batch runs: throughput and time to first output (sim); ``true`` and pools (QEMU).

On sim hosts: runs completed per minute and submit → first output line. On real QEMU: a run of
``true`` against the raw boot + ``guest-exec``, and a pooled run's start against a fresh one.

    python bench/runs.py [--runs 200] [--rate 5] [--workers 2] [--hosts 8] [--smoke]
    python bench/runs.py --real [--real-runs 3] [--no-sim] [--smoke]      (root: private libvirtd)

sim (unless ``--no-sim``): a fresh SQLite database in a temporary directory (django-q2's ORM
broker), ``--hosts`` sim hosts (zero step delays), one image ``bench-debian`` (OS "Debian 12")
whose simulated command profile (``SimExecProfile``) prints three lines at once and exits 0, a
staff owner (quotas are not what is measured), a qcluster with ``--workers`` worker processes
(a child process, stopped by its PID), then
  1. burst: ``--runs`` runs of ``make test`` on the platform ``debian-12`` submitted at once
     through ``runs.services.submit`` (what the API, the page and ``manage.py run`` call): runs
     completed per minute = successful runs / (last end − first submit) (target ≥ 600);
  2. paced: ``--runs`` more at ``--rate`` per second: p50/p99 from submit (``Run.created``) to
     the first output line, i.e. the time of the run's first ``run.output`` event in the outbox,
     when the run's page, the websocket and the log API can show it (target p99 < 2 s at 5/s).
Each run builds its VM, puts its inputs, starts the command, reads its output, destroys the VM.

real (``--real``, off by default: it needs root and QEMU): the test guest of
``tools/guest-image/build.py`` on the private libvirtd of ``tools/localkvm.py``, in the same
invocation and interleaved so that both see the same load, ``--real-runs`` times:
  a. raw: define + start of the guest with a fresh seed until its agent answers ``guest-ping``,
     ``guest-exec /bin/true`` until ``guest-exec-status`` says it exited, then destroy + undefine;
  b. vclmgr: a fresh SQLite database, the daemon registered as a ``libvirt`` host (domain type
     qemu, user-mode network), an image with readiness ``agent``, a real qcluster: ``submit`` of
     ``true`` until the command started (``Run.started``), its exit was read (the end of the
     job's last ``wait-N`` step) and the run ended (``Run.ended``: VM destroyed); vclmgr's own
     share is submit → exit read less its VM's start and boot (the job's ``start``, ``address``
     and ``ready`` steps), on the same run, so load does not count as vclmgr's. Beside it the
     plain difference vclmgr − raw, which also holds the two domains' differences (the raw one
     is ``tests/realvm.domain_xml``, vclmgr's its libvirt driver's).
Then the image gets ``pool_size`` 1: one more fresh run fills the pool (counted among the fresh
runs' starts; the first fresh run also stages the image, its time is shown apart) and
``--real-runs`` runs start on the pooled VM: submit → command started, pooled against fresh
(a pooled VM resumes its warm snapshot, taken after its first boot: no boot; ``runs/pooling.py``).

``--smoke``: 10 runs, 2 hosts (seconds); with ``--real``, one run of each kind (three boots).
Targets are printed beside the figures; a missed one does not fail the script, an error does
(a run that failed, a timeout, a child that crashed).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# bench/ is on the path of a script run from it: take its helpers, then drop it, since this
# file's name would hide the Django app ``runs``.
from _common import child_env, percentile, run_child, sim_hosts  # noqa: E402
from provision import group_cpu_seconds, start_workers, stop  # noqa: E402

sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

IMAGE = "bench-debian"
OUTPUT = "collecting ...\nRan 12 tests: OK\nbench done\n"
TARGET_PER_MINUTE = 600
TARGET_FIRST_OUTPUT_P99 = 2.0
TARGET_RATE = 5.0
RUN_TIMEOUT = 600  # s a real run may take (a boot under software emulation on a shared machine)


# --- shared by both children ---------------------------------------------------------------


def setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django_q.brokers import get_broker

    call_command("migrate", verbosity=0)
    get_broker().purge_queue()


def owner():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("bench-user", password=os.urandom(8).hex(), is_staff=True)


def started_workers(workers):
    from monitoring.health import live_worker_count

    worker = start_workers(SimpleNamespace(workers=workers, profile=None))
    deadline = time.monotonic() + 60
    while live_worker_count() < workers:
        if worker.poll() is not None or time.monotonic() > deadline:
            stop(worker, graceful=False)
            raise SystemExit("the qcluster did not report its workers")
        time.sleep(0.1)
    return worker


def wait_final(ids, timeout, interval=0.1):
    from runs.models import FINAL, Run

    deadline = time.monotonic() + timeout
    while Run.objects.filter(pk__in=ids, state__in=FINAL).count() < len(ids):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {len(ids)} runs to end")
        time.sleep(interval)
    return list(Run.objects.filter(pk__in=ids))


def failures(runs):
    failed = [run for run in runs if run.state != "success"]
    for run in failed[:3]:
        print(f"run {run.pk} {run.state}: {run.error[:300]}", file=sys.stderr, flush=True)
    return len(failed)


# --- sim -------------------------------------------------------------------------------------


def sim_child(args):
    from drivers.sim.models import SimExecProfile
    from jobs import services as jobs
    from provisioning import services as vms

    per_host = -(-2 * args.runs // args.hosts) + 2  # room for every run at once, whatever the queue does
    sim_hosts(args.hosts, per_host)
    image = vms.create_image(
        actor="bench",
        name=IMAGE,
        os="Debian 12",
        min_memory_mib=256,
        default_vcpus=1,
        default_memory_mib=512,
        default_disk_gib=5,
    )
    vms.add_variant(image, actor="bench", hypervisor_type="sim", format="sim", location=f"sim://library/{IMAGE}")
    SimExecProfile.objects.create(image=IMAGE, output=OUTPUT, exit_status=0, seconds=0)
    user = owner()
    jobs.set_queue_settings(actor="bench", limit=max(4, args.workers * 2))
    worker = started_workers(args.workers)
    try:
        result = {**sim_burst(user, args.runs), **sim_paced(user, args.runs, args.rate)}
        result["cluster_cpu_ms_per_run"] = round(1000 * group_cpu_seconds(worker.pid) / (2 * args.runs), 1)
    finally:
        stop(worker, graceful=False)
    print(json.dumps(result), flush=True)


def submit_sim(user):
    from runs import services

    t0 = time.perf_counter()
    run = services.submit(actor="bench", owner=user, platform="debian-12", argv=["make", "test"])
    return run.pk, time.perf_counter() - t0


def first_output(ids):
    """Seconds from each run's submit to its first ``run.output`` event (None: no output seen)."""
    from django.db.models import Min

    from core.models import Event
    from runs.models import Run

    topics = [f"run.{pk}" for pk in ids]
    firsts = dict(
        Event.objects.filter(kind="run.output", topic__in=topics).values_list("topic").annotate(first=Min("created"))
    )
    created = dict(Run.objects.filter(pk__in=ids).values_list("pk", "created"))
    return [(firsts[f"run.{pk}"] - created[pk]).total_seconds() for pk in ids if f"run.{pk}" in firsts]


def sim_burst(user, count):
    submitted = [submit_sim(user) for _ in range(count)]
    runs = wait_final([pk for pk, _ in submitted], 900)
    done = [run for run in runs if run.state == "success"]
    span = (max(run.ended for run in runs) - min(run.created for run in runs)).total_seconds()
    waits = first_output([run.pk for run in done])
    return {
        "burst_per_minute": round(60 * len(done) / span, 1),
        "burst_span_s": round(span, 2),
        "burst_first_p50_s": round(percentile(waits, 0.5), 3),
        "burst_first_p99_s": round(percentile(waits, 0.99), 3),
        "burst_failed": failures(runs),
        "submit_p50_ms": round(1000 * statistics.median(s for _, s in submitted), 1),
    }


def sim_paced(user, count, rate):
    ids, start = [], time.monotonic()
    for index in range(count):
        time.sleep(max(0.0, start + index / rate - time.monotonic()))
        ids.append(submit_sim(user)[0])
    behind = time.monotonic() - start - (count - 1) / rate  # >0: submitting could not keep the rate
    runs = wait_final(ids, 900)
    done = [run for run in runs if run.state == "success"]
    waits = first_output([run.pk for run in done])
    ends = [(run.ended - run.created).total_seconds() for run in done]
    return {
        "paced_first_p50_s": round(percentile(waits, 0.5), 3),
        "paced_first_p99_s": round(percentile(waits, 0.99), 3),
        "paced_first_max_s": round(max(waits, default=float("nan")), 3),
        "paced_end_p50_s": round(percentile(ends, 0.5), 3),
        "paced_end_p99_s": round(percentile(ends, 0.99), 3),
        "paced_failed": failures(runs),
        "paced_submit_lag_s": round(max(0.0, behind), 2),
        "no_output": len(done) - len(waits),
    }


def mark(ok):
    return "met" if ok else "MISSED"


def print_sim(args, got):
    w = 46
    print(
        f"batch runs on {args.hosts} sim hosts (zero delays), {args.workers} worker processes, SQLite + ORM "
        f"broker; load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':<{w}} {'measured':>10}   target")
    print(f"burst: {args.runs} runs submitted at once")
    print(
        f"{'  runs completed per minute':<{w}} {got['burst_per_minute']:>10.0f}   ≥ {TARGET_PER_MINUTE}  "
        f"{mark(got['burst_per_minute'] >= TARGET_PER_MINUTE)}"
    )
    print(f"{'  first submit → last end (s)':<{w}} {got['burst_span_s']:>10.2f}")
    print(
        f"{'  submit → first output p50 / p99 (s)':<{w}} {got['burst_first_p50_s']:>10.3f}   "
        f"/ {got['burst_first_p99_s']:.3f} (under the backlog)"
    )
    print(f"{'  failed runs':<{w}} {got['burst_failed']:>10}   0  {mark(not got['burst_failed'])}")
    lag = f" (submitting lagged {got['paced_submit_lag_s']} s)" if got["paced_submit_lag_s"] else ""
    print(f"paced: {args.runs} runs at {args.rate:g}/s{lag}")
    p99_ok = got["paced_first_p99_s"] < TARGET_FIRST_OUTPUT_P99
    target = f"< {TARGET_FIRST_OUTPUT_P99:g}" + ("" if args.rate >= TARGET_RATE else f" at {TARGET_RATE:g}/s")
    print(f"{'  submit → first output p99 (s)':<{w}} {got['paced_first_p99_s']:>10.3f}   {target}  {mark(p99_ok)}")
    print(
        f"{'  submit → first output p50 / max (s)':<{w}} {got['paced_first_p50_s']:>10.3f}   "
        f"/ {got['paced_first_max_s']:.3f}"
    )
    print(f"{'  submit → end p50 / p99 (s)':<{w}} {got['paced_end_p50_s']:>10.3f}   / {got['paced_end_p99_s']:.3f}")
    print(
        f"{'  failed runs / successful without output':<{w}} {got['paced_failed']:>10}   "
        f"/ {got['no_output']}   0  {mark(not got['paced_failed'] and not got['no_output'])}"
    )
    print(f"{'submit p50 (ms, in the submitting process)':<{w}} {got['submit_p50_ms']:>10.1f}")
    print(f"{'qcluster CPU per run (ms, all its processes)':<{w}} {got['cluster_cpu_ms_per_run']:>10.1f}")
    return got["burst_failed"] + got["paced_failed"] + got["no_output"]


# --- real QEMU -------------------------------------------------------------------------------


def agent(dom, name, **arguments):
    import libvirt_qemu

    request = {"execute": name, **({"arguments": arguments} if arguments else {})}
    return json.loads(libvirt_qemu.qemuAgentCommand(dom, json.dumps(request), 10, 0))["return"]


def raw_true(pool):
    """Define + start → agent answers → ``/bin/true`` exited → destroyed, seconds from t0."""
    from tests import realvm

    login = realvm.new_login()
    t0 = time.monotonic()
    guest = realvm.start_guest(pool, f"{realvm.PREFIX}bench-runs-{login['login']}", realvm.seed_for(login))
    try:
        ping = guest.wait_agent(RUN_TIMEOUT) + guest.started - t0
        pid = agent(guest.dom, "guest-exec", path="/bin/true")["pid"]
        while not agent(guest.dom, "guest-exec-status", pid=pid).get("exited"):
            time.sleep(0.05)
        exited = time.monotonic() - t0
    finally:
        realvm.remove_guest(pool, guest)
    return {"agent": ping, "exited": exited, "gone": time.monotonic() - t0}


def vclmgr_true(user, image):
    """Submit ``true``; seconds from submit to command started, exit read, run ended."""
    from jobs.models import Job
    from runs import services

    run = services.submit(actor="bench", owner=user, image=image, argv=["true"])
    [run] = wait_final([run.pk], RUN_TIMEOUT, interval=0.05)
    if run.state != "success":
        raise SystemExit(f"run {run.pk} {run.state}: {run.error}\n{run.reason}")
    job = Job.objects.get(pk=run.job)
    spent, before, exit_read = {}, job.started, None
    for step in job.steps:  # each step's time: from the previous step's end to its own
        ended = datetime.fromisoformat(step["ended"])
        spent[step["name"]] = (ended - before).total_seconds()
        before = ended
        if step["name"].startswith("wait-"):
            exit_read = ended
    pooled = any(entry[1].startswith("started on a pooled VM") for entry in run.reason)
    exited = (exit_read - run.created).total_seconds()
    boot = sum(spent.get(name, 0) for name in ("start", "address", "ready"))  # libvirt's start, the guest's boot
    return {
        "started": (run.started - run.created).total_seconds(),
        "exited": exited,
        "boot": boot,
        "own": exited - boot,
        "gone": (run.ended - run.created).total_seconds(),
        "pooled": pooled,
    }


def real_child(args):
    import libvirt
    from django.conf import settings

    from provisioning import services as vms
    from provisioning.models import HostImage
    from tests import realvm
    from tests.localkvm_inventory import kvm_guest_image, kvm_host

    image_info = realvm.guest_image()
    daemon = realvm.Libvirtd.acquire()  # lists its socket in VCLMGR_LIBVIRT_SOCKETS for the workers
    conn = libvirt.open(daemon.uri)
    raw_pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}bench-runs-raw")
    pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}bench-runs", stage=False)
    worker = None
    try:
        kvm_host(daemon.uri, pool.name, actor="bench")
        image = kvm_guest_image(
            image_info,
            "bench-guest",
            actor="bench",
            os="Debian 12 bench guest",
            default_vcpus=1,
            readiness="agent",
            boot="disk",  # like the raw runs it is compared with
        )
        user = owner()
        worker = started_workers(2)
        raw, fresh, pooled = [], [], []
        for n in range(args.real_runs):  # interleaved: raw and vclmgr under the same load
            raw.append(raw_true(raw_pool))
            if n < args.real_runs - 1:
                fresh.append(vclmgr_true(user, image))
        vms.update_image(image, actor="bench", pool_size=1)
        fresh.append(vclmgr_true(user, image))  # fresh, and its VM fills the pool
        staged = HostImage.objects.get()
        stage = (staged.staged_at - staged.started).total_seconds()
        pooled = [vclmgr_true(user, image) for _ in range(args.real_runs)]
        print(
            json.dumps(
                {"raw": raw, "fresh": fresh, "pooled": pooled, "stage_s": stage, "poll_s": settings.RUN_POLL_SECONDS}
            ),
            flush=True,
        )
    finally:
        if worker is not None:
            stop(worker, graceful=True)
        leftovers(conn, pool)
        raw_pool.close()
        pool.close()
        conn.close()
        daemon.release()


def leftovers(conn, pool):
    """Destroy and undefine the domains on ``pool``'s disks: the parked VM (with its clean
    snapshot), or what a failed run left."""
    import libvirt

    flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    for dom in conn.listAllDomains():
        try:
            if str(pool.path) in dom.XMLDesc(0):
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(flags)
        except libvirt.libvirtError as exc:
            print(f"could not remove the domain {dom.name()}: {exc}", file=sys.stderr)


def print_real(got):
    def p50(rows, key):
        return statistics.median(row[key] for row in rows)

    raw, fresh, pooled = got["raw"], got["fresh"], got["pooled"]
    w = 52
    print(
        f"\nreal QEMU (software emulation), the test guest, 256 MiB, 1 vCPU; p50 of {len(raw)} raw, {len(fresh)} "
        f"fresh, {len(pooled)} pooled runs; run poll {got['poll_s']:g} s"
    )
    print(f"{'seconds from define+start (raw) / submit (vclmgr)':<{w}} {'raw':>8} {'vclmgr':>8} {'pooled':>8}")
    print(
        f"{'  guest agent answers / command started':<{w}} {p50(raw, 'agent'):>8.2f} {p50(fresh, 'started'):>8.2f} "
        f"{p50(pooled, 'started'):>8.2f}"
    )
    print(
        f"{'  `true` exited (vclmgr: its exit read)':<{w}} {p50(raw, 'exited'):>8.2f} {p50(fresh, 'exited'):>8.2f} "
        f"{p50(pooled, 'exited'):>8.2f}"
    )
    print(
        f"{'  VM gone (vclmgr: run ended; pooled: VM parked)':<{w}} {p50(raw, 'gone'):>8.2f} "
        f"{p50(fresh, 'gone'):>8.2f} {p50(pooled, 'gone'):>8.2f}"
    )
    print(
        f"{'  of which its VM started + booted (start..ready)':<{w}} {'':>8} {p50(fresh, 'boot'):>8.2f} "
        f"{p50(pooled, 'boot'):>8.2f}"
    )
    print(
        f"{'vclmgr own share: exit read − its VM start + boot':<{w}} {'':>8} {p50(fresh, 'own'):>8.2f} "
        f"{p50(pooled, 'own'):>8.2f}"
    )
    share = p50(fresh, "exited") - p50(raw, "exited")
    print(f"{'vclmgr − raw, `true` exited (p50; boots differ)':<{w}} {'':>8} {share:>8.2f}")
    print(f"{'pooled start against fresh (p50, s)':<{w}} {p50(pooled, 'started'):>8.2f} vs {p50(fresh, 'started'):.2f}")
    print(f"{'image staging on the first fresh run (s)':<{w}} {got['stage_s']:>8.2f}")
    missed = sum(not row["pooled"] for row in pooled)
    if missed:
        print(f"{missed} of the pooled runs did not start on a pooled VM", file=sys.stderr)
    return missed


# --- the parent: one child per part ----------------------------------------------------------


def child(part, args, timeout):
    with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
        env = child_env(var, part, VCLMGR_SIM_OPTIONS="{}")
        sizes = {
            "--runs": args.runs,
            "--rate": args.rate,
            "--workers": args.workers,
            "--hosts": args.hosts,
            "--real-runs": args.real_runs,
        }
        command = [sys.executable, __file__, "--one", part, *(str(x) for item in sizes.items() for x in item)]
        print(f"running {part} … (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        return run_child(command, env, part, timeout=timeout, echo_stderr=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="sim: runs per phase (burst, paced)")
    parser.add_argument("--rate", type=float, default=TARGET_RATE, help="sim paced phase: runs submitted per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--real", action="store_true", help="also the real QEMU part (root, libvirtd, QEMU)")
    parser.add_argument("--real-runs", type=int, default=3, help="real: runs of each kind")
    parser.add_argument("--no-sim", action="store_true", help="skip the sim part")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): does it run?")
    parser.add_argument("--one", choices=("sim", "real"), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()  # run_all.py hands every bench the same arguments
    if args.smoke:
        args.runs, args.hosts, args.real_runs = 10, 2, 1
    if args.one:
        setup_django()
        return sim_child(args) if args.one == "sim" else real_child(args)
    errors = 0
    if not args.no_sim:
        errors += print_sim(args, child("sim", args, 1800))
    if args.real:
        errors += print_real(child("real", args, 3600))
    if errors:
        sys.exit(f"{errors} runs failed or gave no output (see above)")
    return None


if __name__ == "__main__":
    main()
