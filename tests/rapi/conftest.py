"""The RAPI tests' fixtures: jobs run in this process (as in the jobs app's tests), and a live
cluster that Ganeti's own RAPI client drives (``cluster``)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from provisioning import services as vms
from tests import processes
from tests.certificates import self_signed
from tests.images import small_image
from tests.jobs.conftest import SyncJobs


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)


@pytest.fixture
def two_nodes(admin_user, alice, make_host):
    """node1 and node2, and the image ``debian-12`` for the sim driver; returns (node1, image)."""
    host = make_host("node1")
    make_host("node2")
    image = vms.create_image(actor="test", name="debian-12", default_memory_mib=512, default_disk_gib=5)
    vms.add_variant(image, actor="test", hypervisor_type="sim", format="sim", location="sim://d", size_gib=1)
    return host, image


SYSTEM_PYTHON = "/usr/bin/python3"
CLIENT = Path(__file__).with_name("ganeti_client.py")


@pytest.fixture
def cluster(transactional_db, tmp_path, make_host, admin_user):
    """Three sim hosts, an image, a worker cluster and daphne serving HTTPS; ``.call(user, pw, …)``."""
    if (
        not os.path.exists(SYSTEM_PYTHON)
        or subprocess.run(  # noqa: S603 (fixed command)
            [SYSTEM_PYTHON, "-c", "import ganeti.rapi.client"], capture_output=True
        ).returncode
    ):
        pytest.fail("Ganeti's RAPI client is missing: apt-get install python3-ganeti-rapi (make install-dev)")
    for n in (1, 2, 3):
        make_host(f"node{n}", cpus=16, memory_mib=32768, disk_gib=500)
    small_image("debian-12", "sim://deb")
    cert, key = self_signed(tmp_path, "rapi")
    worker = processes.start_worker(tmp_path, workers=2)
    (tmp_path / "web").mkdir()
    try:
        web = processes.start_asgi(tmp_path / "web", tls=(cert, key))
    except BaseException:
        worker.stop()
        raise

    class Cluster:
        port = web.port
        cafile = str(cert)

        def call(self, user, password, *calls):
            order = {
                "port": self.port,
                "cafile": self.cafile,
                "user": user,
                "password": password,
                "calls": [list(c) + [{}] * (3 - len(c)) for c in calls],
            }
            done = subprocess.run(  # noqa: S603 (fixed command)
                [SYSTEM_PYTHON, str(CLIENT)],
                input=json.dumps(order),
                capture_output=True,
                text=True,
                timeout=180,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
            assert done.returncode == 0, done.stderr + web.output()[-3000:]
            return json.loads(done.stdout)

        def admin(self, *calls):
            return self.call("admin", "admin-pass-1", *calls)

    try:
        yield Cluster()
    finally:
        web.stop()
        worker.stop()


def ok(answers):
    bad = [a for a in answers if "ok" not in a]
    assert not bad, bad
    return [a["ok"] for a in answers]
