"""deploy/: the systemd units pass ``systemd-analyze verify``, and the container files hold
together (the images are not built here: that needs a registry and a container engine)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
VENV_PYTHON = "/opt/vclmgr/.venv/bin/python"


def _keys(text):
    return [line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#")]


def test_there_is_a_unit_per_role():
    assert {unit.name for unit in UNITS} >= {"vclmgr-web.service", "vclmgr-worker.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_unit_verifies(unit, tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: install Debian's systemd package (make system-test)"
    # verify checks that ExecStart's program exists: point the copy at this checkout's venv.
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(VENV_PYTHON, sys.executable).replace("/opt/vclmgr", str(ROOT)))
    result = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip()) == (0, ""), result.stderr


@pytest.mark.parametrize("role", ["web", "worker"])
def test_a_role_unit_runs_serve_with_restarts_and_hardening(role):
    keys = _keys((DEPLOY / f"vclmgr-{role}.service").read_text())
    values = {}
    for key, value in keys:
        values.setdefault(key, []).append(value)
    assert len(values["ExecStart"]) == 1
    assert values["ExecStart"][0].startswith(f"{VENV_PYTHON} manage.py serve --role {role} ")
    assert values["Type"] == ["exec"] and values["Restart"] == ["on-failure"]
    assert values["EnvironmentFile"] == ["/etc/vclmgr/vclmgr.env"]
    assert values["ProtectSystem"] == ["strict"] and values["ReadWritePaths"] == ["/var/lib/vclmgr"]
    assert "VCLMGR_VAR_DIR=/var/lib/vclmgr" in values["Environment"][0]
    assert values["NoNewPrivileges"] == ["yes"] and values["CapabilityBoundingSet"] == [""]


def test_the_compose_file_runs_both_roles_on_postgres_and_redis():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) >= {"postgres", "redis", "web", "worker", "migrate"}
    for role in ("web", "worker"):
        service = services[role]
        assert service["command"][:3] == ["serve", "--role", role]
        assert service["environment"]["DATABASE_URL"].startswith("postgres://")
        assert service["environment"]["REDIS_URL"].startswith("redis://redis:")
        assert set(service["depends_on"]) == {"postgres", "redis"}
        assert service["healthcheck"]["test"]
        assert service["build"]["dockerfile"] == "deploy/Containerfile"
    assert "/healthz/ready" in " ".join(services["web"]["healthcheck"]["test"])
    assert services["worker"]["healthcheck"]["test"][-2:] == ["worker_check", "--ready"]
    assert (DEPLOY / services["web"]["env_file"].replace(".env", ".env.example")).exists()


def test_the_containerfile_is_debian_installs_the_requirements_and_collects_static():
    text = (DEPLOY / "Containerfile").read_text()
    assert re.search(r"^FROM \S*debian:12", text, re.M)
    assert "pip install --no-cache-dir -r requirements.txt" in text
    assert "manage.py collectstatic --noinput" in text
    assert '"serve", "--role", "web"' in text


def test_the_probes_the_deployment_names_exist():
    from django.urls import resolve

    assert resolve("/healthz/ready").url_name == "healthz-ready"
    assert resolve("/healthz/live").url_name == "healthz-live"
    assert (ROOT / "monitoring" / "management" / "commands" / "worker_check.py").exists()


def _image_env():
    """The ENV of the Containerfile, as ``{name: value}`` (``$PATH`` left as written)."""
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            found.update(part.split("=", 1) for part in line[4:].split())
    return found


def _writable(service):
    """The paths a compose service may write to: its tmpfs mounts and volume targets."""
    volumes = [v.split(":")[1] if isinstance(v, str) else v["target"] for v in service.get("volumes", [])]
    return [t.split(":")[0] for t in service.get("tmpfs", [])] + volumes


def _under(path, mounts):
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


# What the settings write to, printed by a process that loads them in the service's environment.
WRITES = """
import json
from django.conf import settings as s
from django.core.files.storage import storages
from monitoring import worker_health
dirs = {"VCLMGR_VAR_DIR": str(s.VAR_DIR), "PROMETHEUS_MULTIPROC_DIR": s.PROMETHEUS_MULTIPROC_DIR,
        "runs storage (inputs, artifacts)": storages["runs"].location,
        "worker heartbeats": str(worker_health.beat_dir())}
if s.EMAIL_BACKEND.endswith(".filebased.EmailBackend"):
    dirs["mail files"] = s.EMAIL_FILE_PATH
if s.CACHES["default"]["BACKEND"].endswith(".FileBasedCache"):
    dirs["file cache"] = s.CACHES["default"]["LOCATION"]
if s.MEDIA_ROOT:
    dirs["media"] = str(s.MEDIA_ROOT)
print(json.dumps({"writes": dirs, "static": str(s.STATIC_ROOT)}))
"""


@pytest.mark.parametrize("role", ["web", "worker", "migrate"])
def test_every_directory_the_settings_write_to_is_writable_in_the_read_only_container(role, tmp_path):
    from cryptography.fernet import Fernet

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    service = compose["services"][role]
    assert service["read_only"] is True
    env = {**_image_env(), **dict(_keys((DEPLOY / "vclmgr.env.example").read_text())), **service["environment"]}
    # The container's file system lives under a scratch root here: settings create their folders.
    root = str(tmp_path / "container")
    for name, value in list(env.items()):
        if name.endswith("_FILE"):
            secret = Path(root + value)
            secret.parent.mkdir(parents=True, exist_ok=True)
            secret.write_text(Fernet.generate_key().decode())
        if value.startswith("/") and name != "PATH":
            env[name] = root + value
    env.update(PATH="/usr/bin:/bin", HOME=str(tmp_path), DJANGO_SETTINGS_MODULE="vclmgr.settings")
    done = subprocess.run([sys.executable, "-c", WRITES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    mounts = _writable(service)
    inside = {what: path.removeprefix(root) for what, path in found["writes"].items()}
    assert {what: path for what, path in inside.items() if not _under(path, mounts)} == {}, mounts
    # The static files are the image's: a mount there would hide them.
    assert not _under(found["static"].removeprefix(root), mounts)
    assert "runs" in compose["volumes"] and "runs:/var/lib/vclmgr/runs" in service["volumes"]
