import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from core.env import Env
from tests.processes import ROOT


def test_it_reads_a_choice_strictly():
    assert Env({"A": " Staff "}).choice("A", ("staff", "public"), "public") == "staff"
    assert Env({}).choice("A", ("staff", "public"), "public") == "public"
    with pytest.raises(ImproperlyConfigured, match=r"^A: expected one of staff, public, got 'all'"):
        Env({"A": "all"}).choice("A", ("staff", "public"), "public")


def test_it_reads_typed_values():
    env = Env({"A": "yes", "B": "42", "C": "a, b,,c", "D": "1.5"})
    assert env.bool("A", False) is True
    assert env.int("B", 0) == 42
    assert env.list("C", []) == ["a", "b", "c"]
    assert env.float("D", 0.0) == 1.5
    assert env.str("MISSING", "fallback") == "fallback"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.bool("FLAG", False), "FLAG: expected a boolean"),
        (lambda e: e.int("COUNT", 1), "COUNT: expected an integer"),
        (lambda e: e.int("SMALL", 1, minimum=5), "SMALL: must be at least 5"),
        (lambda e: e.url("DATABASE_URL", {"sqlite", "postgres"}), "DATABASE_URL: unsupported URL scheme 'mysql'"),
        (lambda e: e.str("REQUIRED"), "REQUIRED is required"),
    ],
)
def test_it_rejects_bad_values_naming_the_variable(call, message):
    env = Env({"FLAG": "maybe", "COUNT": "many", "SMALL": "2", "DATABASE_URL": "mysql://x/y"})
    with pytest.raises(ImproperlyConfigured, match=message):
        call(env)


def test_it_reads_secrets_from_files(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    assert Env({"SECRET_KEY_FILE": str(secret)}).str("SECRET_KEY") == "s3cret"
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY_FILE: cannot read"):
        Env({"SECRET_KEY_FILE": str(tmp_path / "absent")}).str("SECRET_KEY")


def _manage(*args, **env):
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "VCLMGR_VAR_DIR": env.pop("VCLMGR_VAR_DIR")}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "perhaps"}, "DEBUG: expected a boolean"),
        ({"DEBUG": "1", "DATABASE_URL": "mysql://db/x"}, "DATABASE_URL: unsupported URL scheme"),
        ({"DEBUG": "1", "REDIS_URL": "http://nope"}, "REDIS_URL: unsupported URL scheme"),
        ({"DEBUG": "1", "VCLMGR_WORKERS": "0"}, "VCLMGR_WORKERS: must be at least 1"),
        ({"DEBUG": "0"}, "SECRET_KEY is required"),
        ({"DEBUG": "1", "CSRF_TRUSTED_ORIGINS": "example.org"}, "CSRF_TRUSTED_ORIGINS: 'example.org' needs a scheme"),
    ],
)
def test_a_bad_environment_stops_the_start_with_a_clear_message(tmp_path, env, message):
    result = _manage("check", VCLMGR_VAR_DIR=str(tmp_path), **env)
    assert result.returncode != 0
    assert message in result.stderr


def test_production_settings_pass_the_deploy_check_with_no_warnings(tmp_path):
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        VCLMGR_VAR_DIR=str(tmp_path),
        DEBUG="0",
        SECRET_KEY="x7!" + "k" * 20 + "Qz9-" + "m" * 30 + "#p",
        ALLOWED_HOSTS="vcl.example.org",
        CSRF_TRUSTED_ORIGINS="https://vcl.example.org",
        CREDENTIAL_KEY=Fernet.generate_key().decode(),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "System check identified no issues" in result.stdout
