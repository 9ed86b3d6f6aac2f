"""Demo users. Passwords are generated once and kept in var/ so every run prints the same."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model

DEMO_USERS = [("admin", True), ("demo", False)]


def users(stdout):
    path = settings.VAR_DIR / "demo_credentials.txt"
    known = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line) if path.exists() else {}
    User = get_user_model()
    for name, staff in DEMO_USERS:
        password = known.get(name) or secrets.token_urlsafe(9)
        user, created = User.objects.get_or_create(username=name, defaults={"is_staff": staff, "is_superuser": staff})
        if created or name not in known:
            user.set_password(password)
            user.save()
        known[name] = password
        stdout.write(f"  {'admin' if staff else 'user '} login: {name} / {password}")
    path.write_text("".join(f"{n}:{p}\n" for n, p in known.items()))
    path.chmod(0o600)
