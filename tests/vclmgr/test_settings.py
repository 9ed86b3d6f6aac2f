"""The tunables declared in vclmgr/settings.py: read strictly from the environment."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from core.env import Env
from tests.processes import settings_child


def test_it_reads_json_values():
    env = Env({"OPTS": '{"vmware": {"insecure": true}}', "BLANK": " "})
    assert env.json("OPTS", {}) == {"vmware": {"insecure": True}}
    assert env.json("BLANK", {"d": 1}) == {"d": 1} and env.json("MISSING", {}) == {}


def test_it_rejects_invalid_json_naming_the_variable():
    with pytest.raises(ImproperlyConfigured, match=r"^OPTS: invalid JSON"):
        Env({"OPTS": "{vmware: 1}"}).json("OPTS", {})
    with pytest.raises(ImproperlyConfigured, match=r"^OPTS: not a list"):
        Env({"OPTS": "{}"}).json("OPTS", [], check=lambda v: None if isinstance(v, list) else "not a list")


def test_the_defaults():
    from django.conf import settings

    assert (settings.VCLMGR_STAGE_PER_HOST, settings.VCLMGR_STAGE_PER_CHASSIS, settings.VCLMGR_STAGE_GLOBAL) == (
        2,
        4,
        16,
    )
    assert settings.VCLMGR_ADDRESS_TIMEOUT == 120 and settings.VCLMGR_SAVE_REFUSED_DECISIONS == ""
    assert settings.VCLMGR_DRIVER_OPTIONS == {} and settings.VCLMGR_SIM_OPTIONS == {}
    assert settings.VCLMGR_OUTBOUND_ALLOW == []  # outbound requests reach public addresses only
    assert (settings.VCLMGR_IMAGE_FETCH_TIMEOUT, settings.VCLMGR_IMAGE_FETCH_MAX_GIB) == (3600, 100)


def _settings_of(**env):
    code = (
        "from django.conf import settings\n"
        "print(settings.VCLMGR_DRIVER_OPTIONS, settings.VCLMGR_STAGE_GLOBAL, settings.VCLMGR_SIM_OPTIONS)\n"
    )
    return settings_child(code, **env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VCLMGR_DRIVER_OPTIONS": '{"vmware": '}, "VCLMGR_DRIVER_OPTIONS: invalid JSON"),
        ({"VCLMGR_DRIVER_OPTIONS": '{"xen": {}}'}, "VCLMGR_DRIVER_OPTIONS: unknown driver 'xen'"),
        ({"VCLMGR_DRIVER_OPTIONS": '{"vmware": 1}'}, "VCLMGR_DRIVER_OPTIONS: the options of vmware must be"),
        ({"VCLMGR_SIM_OPTIONS": "[1]"}, "VCLMGR_SIM_OPTIONS: expected a JSON object"),
        ({"VCLMGR_STAGE_PER_HOST": "0"}, "VCLMGR_STAGE_PER_HOST: must be at least 1"),
        ({"VCLMGR_STAGE_GLOBAL": "many"}, "VCLMGR_STAGE_GLOBAL: expected an integer"),
        ({"VCLMGR_ADDRESS_TIMEOUT": "0"}, "VCLMGR_ADDRESS_TIMEOUT: must be at least 1"),
        ({"VCLMGR_OUTBOUND_ALLOW": "10.0.0.0/8, http://bmc"}, "VCLMGR_OUTBOUND_ALLOW: 'http://bmc' is neither"),
    ],
)
def test_a_bad_tunable_stops_the_start_naming_the_variable(tmp_path, env, message):
    result = _settings_of(VCLMGR_VAR_DIR=str(tmp_path), **env)
    assert result.returncode != 0 and message in result.stderr


def test_tunables_are_read_from_the_environment(tmp_path):
    result = _settings_of(
        VCLMGR_VAR_DIR=str(tmp_path),
        VCLMGR_DRIVER_OPTIONS='{"vmware": {"insecure": true}}',
        VCLMGR_STAGE_GLOBAL="3",
        VCLMGR_SIM_OPTIONS='{"delay": 0.1}',
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'vmware': {'insecure': True}} 3 {'delay': 0.1}"


def test_the_driver_kinds_settings_check_are_the_registrys():
    # Settings name the kinds rather than import the drivers' registry (no app code in settings).
    from django.conf import settings

    from drivers import registry

    assert tuple(settings.DRIVER_KINDS) == tuple(registry.KINDS)
