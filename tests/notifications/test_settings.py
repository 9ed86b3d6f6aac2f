"""The e-mail, notification and metrics settings: Django's own names, read strictly."""

import pytest

from tests.processes import settings_child

PRINT = (
    "from django.conf import settings as s\n"
    "print(s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT, s.EMAIL_HOST_PASSWORD, s.EMAIL_USE_TLS, s.DEFAULT_FROM_EMAIL,"
    " s.NOTIFY_ENDING_MINUTES, s.METRICS_TOKEN, s.METRICS_ALLOWED_NETWORKS, s.EMAIL_FILE_PATH.endswith('/mail'))\n"
)


def _run(tmp_path, **env):
    return settings_child(PRINT, VCLMGR_VAR_DIR=str(tmp_path), **env)


def test_without_an_smtp_host_mail_stays_in_files_under_var(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "django.core.mail.backends.filebased.EmailBackend"
    assert done.stdout.split()[-1] == "True"


def test_it_reads_djangos_email_names_and_secrets_from_files(tmp_path):
    (tmp_path / "pw").write_text("smtp-secret\n")
    (tmp_path / "tok").write_text("scrape-token\n")
    env = {
        "EMAIL_HOST": "mail.example.org",
        "EMAIL_PORT": "587",
        "EMAIL_HOST_PASSWORD_FILE": str(tmp_path / "pw"),
        "EMAIL_USE_TLS": "1",
        "DEFAULT_FROM_EMAIL": "lab@example.org",
        "NOTIFY_ENDING_MINUTES": "5",
        "METRICS_TOKEN_FILE": str(tmp_path / "tok"),
        "METRICS_ALLOWED_NETWORKS": "10.0.0.0/8, 127.0.0.1",
    }
    done = _run(tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "django.core.mail.backends.smtp.EmailBackend",
        "mail.example.org",
        "587",
        "smtp-secret",
        "True",
        "lab@example.org",
        "5",
        "scrape-token",
        "['10.0.0.0/8',",
        "'127.0.0.1']",
        "True",
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EMAIL_PORT": "smtp"}, "EMAIL_PORT: expected an integer"),
        ({"EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1"}, "EMAIL_USE_TLS and EMAIL_USE_SSL"),
        ({"EMAIL_USE_TLS": "maybe"}, "EMAIL_USE_TLS: expected a boolean"),
        ({"EMAIL_BACKEND": "carrier-pigeon"}, "EMAIL_BACKEND: expected one of"),
        ({"NOTIFY_ENDING_MINUTES": "-1"}, "NOTIFY_ENDING_MINUTES: must be at least 0"),
        ({"WEBHOOK_TIMEOUT_SECONDS": "30"}, "WEBHOOK_TIMEOUT_SECONDS: must be at most 10"),
        ({"NOTIFY_SEND_BUDGET_SECONDS": "2", "WEBHOOK_TIMEOUT_SECONDS": "5"}, "must be at most NOTIFY_SEND_BUDGET"),
        ({"METRICS_ALLOWED_NETWORKS": "the office"}, "METRICS_ALLOWED_NETWORKS: 'the office' is not a network"),
    ],
)
def test_a_bad_value_stops_the_start_naming_the_variable(tmp_path, env, message):
    done = _run(tmp_path, **env)
    assert done.returncode != 0 and message in done.stderr
