"""Raw boot of the real test guest under this machine's libvirtd + QEMU (software emulation).

    python bench/real_vm.py [--runs 5] [--boot disk,kernel] [--together 3]

For each boot mode (``disk``: SYSLINUX from the qcow2 overlay, as real images boot;
``kernel``: direct boot of the uncompressed kernel + initramfs) it times define + start of a
guest with a fresh NoCloud seed until (1) the QEMU guest agent answers ``guest-ping`` and
(2) the guest's SSH server sends its banner through the 127.0.0.1 forward, then (3) an SSH
login with the seed's key runs ``id -un``. p50 over ``--runs`` guests one after another, then
``--together`` guests started at once (p50 and the slowest). vclmgr's reserve-to-ready column
comes when the libvirt driver is wired to the guest contract (issue 14).
Starts its own private libvirtd unless one from a test run is up (tests/realvm.py).
"""

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import realvm  # noqa: E402
from tests.realvm import new_login, seed_for, ssh_run  # noqa: E402


def one(pool, user, boot, t0=None):
    name = f"{realvm.PREFIX}bench-{user['login']}"
    t0 = time.monotonic() if t0 is None else t0
    guest = realvm.start_guest(pool, name, seed_for(user), boot)
    try:
        agent = guest.wait_agent(300) + guest.started - t0
        ssh = guest.wait_ssh(300) + guest.started - t0
        assert ssh_run(guest.port, user["login"], "id -un", pkey=user["pkey"]).strip() == user["login"]
        login = time.monotonic() - t0
        return agent, ssh, login
    finally:
        realvm.remove_guest(pool, guest)


def row(label, samples):
    cols = [statistics.median(s[i] for s in samples) for i in range(3)]
    return f"{label:<28} {cols[0]:>10.2f} {cols[1]:>10.2f} {cols[2]:>12.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--boot", default="disk,kernel")
    parser.add_argument("--together", type=int, default=3)
    args = parser.parse_args()

    import libvirt

    image = realvm.guest_image()
    t = time.monotonic()
    daemon = realvm.Libvirtd.acquire()
    daemon_s = time.monotonic() - t
    conn = libvirt.open(daemon.uri)
    pool = realvm.Pool(conn, image, name=f"{realvm.PREFIX}bench")
    lines = []
    try:
        for boot in args.boot.split(","):
            serial = [one(pool, new_login(), boot) for _ in range(args.runs)]
            lines.append(row(f"{boot}: one at a time (p50)", serial))
            users = [new_login() for _ in range(args.together)]
            t0 = time.monotonic()
            with ThreadPoolExecutor(args.together) as ex:
                together = list(ex.map(lambda u, t0=t0, boot=boot: one(pool, u, boot, t0), users))
            lines.append(row(f"{boot}: {args.together} at once (p50)", together))
            slowest = [max(s[i] for s in together) for i in range(3)]
            lines.append(f"{f'{boot}: {args.together} at once (max)':<28} "
                         f"{slowest[0]:>10.2f} {slowest[1]:>10.2f} {slowest[2]:>12.2f}")
    finally:
        pool.close()
        conn.close()
        daemon.release()
    print(f"guest image {image['dir'].name} (kernel {image['kernel']}), domain type qemu (TCG), 256 MiB, 1 vCPU")
    print(f"libvirtd ready in {daemon_s:.1f} s (0 if it was already running)")
    print(f"{'seconds from define+start':<28} {'agent ping':>10} {'SSH banner':>10} {'SSH login':>12}")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
