"""The var/ directory holds secrets (the SECRET_KEY, the SQLite database with its session
keys, cache entries): it is the owner's alone (0700), and so is every file vclmgr writes there
(0600), whatever the process's umask."""

import os
import stat
from pathlib import Path


def private_dir(path):
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)
    return path


def write_private(path, text):
    """Create ``path`` readable by its owner only, from its first byte (never chmod after)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    _tighten(Path(path), 0o600)


def tighten_sqlite(database):
    """SQLite creates its file and its -wal/-shm companions with the umask's bits; take
    group's and others' away (the directory already keeps them out)."""
    for suffix in ("", "-wal", "-shm"):
        _tighten(Path(f"{database}{suffix}"), 0o600)


def _tighten(path, mode):
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.getuid():
        path.chmod(mode)
