"""Encryption at rest for hypervisor credentials (Fernet: AES-128-CBC + HMAC-SHA256).

The key comes from ``settings.CREDENTIAL_KEY`` (environment ``CREDENTIAL_KEY`` or
``CREDENTIAL_KEY_FILE``). Several comma-separated keys rotate: the first encrypts, any
decrypts (re-save credentials, then drop the old key). When the environment says DEBUG
and no key is set, one is generated once into ``VAR_DIR/credential_key``, exactly like the
development SECRET_KEY (the environment, not ``settings.DEBUG``, decides: test runners turn
that setting off). Otherwise a missing key is an error the moment a secret is stored or read.

Secrets are only ever decrypted for a driver to connect; nothing shows them back.
"""

import functools
import os

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core.env import Env

KEY_FILE_NAME = "credential_key"


class SecretUnreadable(Exception):
    """The stored secret cannot be decrypted with the configured keys (key changed?)."""


def _configured_keys():
    raw = settings.CREDENTIAL_KEY
    if raw:
        return [k.strip() for k in raw.split(",") if k.strip()]
    if not Env().bool("DEBUG", False):
        raise ImproperlyConfigured(
            "CREDENTIAL_KEY is required to store hypervisor credentials when DEBUG is off "
            "(or set CREDENTIAL_KEY_FILE); generate one with: "
            'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
        )
    return [_development_key(str(settings.VAR_DIR / KEY_FILE_NAME))]


@functools.cache
def _development_key(path):
    if not os.path.exists(path):
        # Created atomically: parallel processes (test workers) must all end up with one key.
        scratch = f"{path}.{os.getpid()}.tmp"
        with open(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
            file.write(Fernet.generate_key().decode())
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(scratch)
    with open(path) as file:
        return file.read().strip()


@functools.cache
def _fernet_for(keys):
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    except (ValueError, TypeError):
        raise ImproperlyConfigured(
            "CREDENTIAL_KEY: each key must be 32 url-safe base64-encoded bytes (Fernet.generate_key())"
        ) from None


def fernet():
    return _fernet_for(tuple(_configured_keys()))


def encrypt(clear):
    """The token to store for ``clear`` ('' stays '': no secret)."""
    if not clear:
        return ""
    return fernet().encrypt(clear.encode()).decode()


def decrypt(token):
    if not token:
        return ""
    try:
        return fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("the stored secret cannot be decrypted with CREDENTIAL_KEY") from None


def check_key():
    """Raise ImproperlyConfigured now if the key is missing or malformed."""
    fernet()
